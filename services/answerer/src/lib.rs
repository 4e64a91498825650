//! The offline answerer: how the product answers a question about a
//! repository with no model. `explore` frames the question as keywords,
//! searches the workspace, ranks files by match density, path relevance and
//! role (`explore::roles`), reads the top hits, verifies the evidence
//! (`grounding`) and drafts the exploration result (`results`), saying
//! honestly what is heuristic and what is unknown.
//!
//! The decisions are one small, pure, synchronous interface, [`draft`]: a
//! question and its workspace index ([`explore::Gathered`]: keywords,
//! ranked files, read windows) in, ranked evidence and an answer draft out
//! ([`draft::draft`]), then the draft and its checked evidence in, the
//! result out ([`draft::finish`]). [`explore::explore`] only wraps it with
//! port calls: search and read to build the index, grounding between the
//! two halves.
//!
//! Its one interface to the outside is [`port::Port`]: the workspace's
//! read-only tools (list, search, find code, read) and, for the flows that
//! use one, the model. The specialists service implements it with recorded
//! and replayed steps; tests and the evaluation harness implement it
//! directly over a sandboxed workspace ([`port::DirectPort`]). Same
//! question, same workspace, same answer: nothing here reads the clock, the
//! network or randomness.
//!
//! Invariant: every evidence item is checked against the workspace through
//! the port before a draft keeps it (`grounding`): a path that does not
//! exist is dropped, and an item whose range or snippet does not check out
//! stays only as an assumption (`verified: false`).

pub mod draft;
pub mod explore;
pub mod grounding;
pub mod port;
pub mod results;
