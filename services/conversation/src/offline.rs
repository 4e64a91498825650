//! The conversation's offline rules: which of the four actions a user message asks for, and the
//! wording of the reply, so the whole product runs with no model. [`OfflineRules`] is a
//! [`Provider`] like the model client: it answers the agent's decision request (the same request
//! a model gets, see [`crate::decide::decision_request`]) by calling one of the same decision
//! tools, so one turn pipeline decides for both.
//!
//! Same input, same output, on every machine and every run: variation comes from an FNV-1a hash
//! of the input, never from randomness or the clock, so its replies need no recording
//! ([`Provider::is_deterministic`]). Nothing here ever claims that code was changed, tested or
//! shipped: change requests become issues.

use serde_json::json;
use zopu_llm::{BoxFuture, ChatReply, ChatRequest, Error, FinishReason, Provider, ToolCall, Usage};

use crate::decide::{Action, DecisionPrompt, Remembered, work_title};

/// `provider_label` of offline replies.
pub const OFFLINE_LABEL: &str = "offline";
/// `model` of offline replies; bump when the rules change so recorded replies say which rules.
pub const OFFLINE_MODEL: &str = "offline-rules-v2";

mod commands;
mod normalized;
mod wording;

use normalized::Normalized;
use wording::{first_sentence, project_label, quote, topic};

/// Most words of the topic quoted back in an acknowledgement.
const TOPIC_WORDS: usize = 3;
/// Longest topic word / project name quoted back (characters).
const TOPIC_WORD_MAX_CHARS: usize = 24;
const PROJECT_NAME_MAX_CHARS: usize = 40;
/// A message is quoted back in a clarifying question only up to this many words.
const QUOTE_MAX_WORDS: usize = 6;
/// Words of the summary's first sentence used in a direct response.
const SUMMARY_MAX_WORDS: usize = 30;

/// What the conversation agent knows when it decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecisionContext {
    /// A project summary is mounted (so overview questions can be answered directly).
    pub has_summary: bool,
    /// The previous assistant turn was a clarifying question; never ask twice in a row.
    pub recent_clarification_asked: bool,
}

/// The four first-slice actions (handoff section 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecisionKind {
    Respond,
    Clarify,
    Explore,
    CreateIssue,
    /// Keep a preference the user stated.
    Remember,
    /// Run the project's verified test command.
    Check,
}

impl DecisionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Respond => "respond",
            DecisionKind::Clarify => "clarify",
            DecisionKind::Explore => "explore",
            DecisionKind::CreateIssue => "create_issue",
            DecisionKind::Remember => "remember",
            DecisionKind::Check => "check",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub kind: DecisionKind,
    /// Which rule fired, for the run log.
    pub rationale: String,
}

impl Decision {
    fn new(kind: DecisionKind, rationale: &str) -> Self {
        Self {
            kind,
            rationale: rationale.to_owned(),
        }
    }
}

#[rustfmt::skip]
const GREETING_OR_THANKS: &[&str] = &[
    "hi", "hello", "hey", "heya", "hiya", "howdy", "yo", "morning", "afternoon", "evening", "good",
    "thanks", "thank", "thx", "ty", "cheers", "appreciated", "appreciate", "great", "perfect",
    "nice", "awesome", "cool", "ok", "okay", "got", "it", "you", "so", "much", "very", "all",
    "there", "team", "again", "a", "lot", "lots", "man", "mate", "folks", "everyone", "zopu", "bye",
    "later", "see", "ya", "excellent", "sounds", "wonderful", "amazing", "yes", "yep", "sure",
    "alright", "that", "that's", "thats", "it's", "is", "was", "super", "helpful", "works",
    "worked", "really",
];
/// Words that open a pleasantry ("thanks for the help", "hello again").
#[rustfmt::skip]
const PLEASANTRY_OPENERS: &[&str] = &[
    "hi", "hello", "hey", "heya", "hiya", "howdy", "thanks", "thank", "thx", "ty", "cheers",
    "great", "perfect", "nice", "awesome", "cool", "good", "excellent",
];

#[rustfmt::skip]
const STATUS_PHRASES: &[&str] = &[
    "any update", "any updates", "any progress", "any news", "are you there", "you there",
    "how is it going", "hows it going", "how's it going", "how are you", "how are things",
    "what are you doing", "what are you working on", "are you done", "is it done", "still working",
    "where are we", "whats the eta", "what's the eta", "how long will", "status update",
    "what's the status", "whats the status", "what is the status", "any status",
];
/// Words that may accompany "status"/"update" and still make a pure status question.
#[rustfmt::skip]
const STATUS_NEUTRAL: &[&str] = &[
    "status", "update", "updates", "progress", "news", "eta", "exploration", "issue", "work",
    "task", "run", "job", "draft", "result", "results",
];

#[rustfmt::skip]
const ISSUE_PHRASES: &[&str] = &[
    "file a bug", "file an issue", "file a ticket", "report a bug", "bug report", "open an issue",
    "open a ticket", "raise an issue", "log a bug", "log an issue", "into an issue",
    "into a ticket", "as an issue", "as a ticket", "write up an issue", "write an issue",
    "create an issue", "create a ticket", "draft an issue", "draft a ticket",
];
#[rustfmt::skip]
const ISSUE_VERBS: &[&str] = &[
    "create", "draft", "write", "open", "file", "make", "raise", "log", "prepare", "turn", "add",
];
const ISSUE_NOUNS: &[&str] = &["issue", "issues", "ticket", "tickets", "story", "epic"];

/// Verbs asking for a code change; they need a subject, or the request is vague.
#[rustfmt::skip]
const CHANGE_VERBS: &[&str] = &[
    "fix", "change", "modify", "refactor", "implement", "add", "update", "rename", "delete",
    "remove", "upgrade", "migrate", "rewrite", "patch", "bump", "replace", "write", "build",
    "create", "edit", "move", "optimize", "optimise", "improve", "clean", "convert", "port",
    "introduce", "support", "make", "set",
];
/// Delivery verbs: specific enough on their own ("deploy it", "push").
#[rustfmt::skip]
const DELIVERY_VERBS: &[&str] = &[
    "commit", "deploy", "push", "merge", "ship", "release", "publish", "rollback",
];
#[rustfmt::skip]
const DELIVERY_PHRASES: &[&str] = &[
    "open a pr", "open a pull request", "send a pr", "make a pr", "create a pr", "raise a pr",
    "ship it", "push it", "merge it", "deploy it", "commit it", "push to", "deploy to",
    "merge into", "commit the", "commit this", "commit these", "roll back", "rollback",
];
#[rustfmt::skip]
const POLITE_PREFIXES: &[&str] = &[
    "please", "pls", "can you", "could you", "would you", "will you", "can we", "could we", "lets",
    "let's", "let us", "i need you to", "i want you to", "i'd like you to", "id like you to",
    "go ahead and", "kindly", "just", "now", "ok", "okay", "so", "hey", "also", "and",
];
#[rustfmt::skip]
const INTERROGATIVES: &[&str] = &[
    "how", "where", "why", "what", "whats", "what's", "which", "who", "when", "does", "do", "is",
    "are", "was", "were", "did", "should", "has", "have", "explain", "describe", "walk", "trace",
    "find", "investigate", "show", "tell", "look", "dig", "understand", "map", "summarize",
    "summarise", "review", "analyze", "analyse", "audit", "compare", "list",
];
#[rustfmt::skip]
/// Requests to run the project's tests (a check flow), unless the message
/// asks how, where or why (a question about them is explored).
const CHECK_PHRASES: &[&str] = &[
    "run the tests", "run tests", "run the test", "run the test suite", "run the checks",
    "run its tests", "run make test", "execute the tests", "run the unit tests", "rerun the tests",
    "re run the tests", "do the tests pass", "are the tests passing", "does the test suite pass",
    "check the tests", "check that the tests pass",
];

const OVERVIEW_PHRASES: &[&str] = &[
    "what does this project do",
    "what is this project",
    "what's this project",
    "whats this project",
    "what does this repo do",
    "what is this repo",
    "what's this repo",
    "whats this repo",
    "what does the project do",
    "what is the project",
    "what does this codebase do",
    "what is this codebase",
    "summarize the project",
    "summarise the project",
    "project overview",
    "give me an overview",
    "overview of the project",
    "overview of this repo",
    "what is zopu",
];

/// Phrases that make a statement a lasting instruction to the agent.
#[rustfmt::skip]
const PREFERENCE_MARKERS: &[&str] = &[
    "from now on", "going forward", "in future", "in the future", "for future", "always",
    "never", "remember that", "remember to", "please remember", "i prefer", "my preference",
    "by default", "every time", "each time",
];
#[rustfmt::skip]
const LANGUAGES: &[&str] = &[
    "english", "german", "french", "spanish", "italian", "portuguese", "dutch", "polish",
    "swedish", "danish", "norwegian", "finnish", "czech", "turkish", "greek", "russian",
    "ukrainian", "japanese", "chinese", "korean", "hindi", "arabic", "hebrew",
];
const REPLY_VERBS: &[&str] = &["answer", "reply", "respond", "write", "talk", "speak"];
const OMIT_WORDS: &[&str] = &[
    "skip", "no", "without", "omit", "leave", "drop", "don't", "dont", "never", "exclude",
];

/// Whether a user's message states a lasting instruction to the agent
/// ("from now on", "always", "I prefer" ... and not a question): the only
/// thing that may cause a write to the agent's memory.
pub fn is_stated_preference(message_text: &str) -> bool {
    states_preference(&Normalized::new(message_text))
}

fn states_preference(text: &Normalized) -> bool {
    !text.question_mark && text.contains_any(PREFERENCE_MARKERS) && !text.is_plain_question()
}

/// A lasting preference stated in `message_text` ("From now on, answer in
/// German", "Always skip tests in issue drafts"), as the agent keeps it:
/// a known topic gets its own key, so a later statement replaces it; any
/// other is kept in the user's words. `None` for anything else, questions
/// included ("do you always answer in German?").
pub fn stated_preference(message_text: &str) -> Option<Remembered> {
    let text = Normalized::new(message_text);
    if !states_preference(&text) {
        return None;
    }
    let has = |words: &[&str]| text.words.iter().any(|word| words.contains(&word.as_str()));
    let language = text.words.windows(3).find_map(|window| {
        (REPLY_VERBS.contains(&window[0].as_str())
            && window[1] == "in"
            && LANGUAGES.contains(&window[2].as_str()))
        .then(|| window[2].clone())
    });
    if let Some(language) = language {
        let mut name = language;
        name[..1].make_ascii_uppercase();
        return Some(Remembered {
            key: "preference.language".to_owned(),
            value: format!("Answer in {name}"),
        });
    }
    let about_tests = has(&["test", "tests", "testing"]);
    let about_issues = has(&["issue", "issues", "ticket", "tickets", "draft", "drafts"]);
    if about_tests && about_issues && has(OMIT_WORDS) {
        return Some(Remembered {
            key: "preference.issue-tests".to_owned(),
            value: "Skip tests in issue drafts".to_owned(),
        });
    }
    let value = clip_chars(message_text.trim(), zopu_core::memory::VALUE_MAX_CHARS);
    // A secret is never kept (the user is answered by the other rules).
    zopu_core::memory::check_value(&value).ok()?;
    Some(Remembered {
        key: format!("preference.{:08x}", fnv1a(&[&text.padded]) as u32),
        value,
    })
}

/// The one-sentence confirmation of a kept preference.
pub fn preference_acknowledgement(remembered: &Remembered) -> String {
    match remembered.key.as_str() {
        "preference.language" => format!(
            "Noted: I'll answer in {} from now on.",
            remembered.value.trim_start_matches("Answer in ")
        ),
        "preference.issue-tests" => {
            "Noted: I'll leave tests out of issue drafts from now on.".to_owned()
        }
        _ => "Noted. I'll keep that in mind from now on; you can see and clear what I remember in the project's memory.".to_owned(),
    }
}

/// Picks one of the four actions for a user message. Rules, in order: greetings and thanks,
/// status questions, explicit issue requests, project-overview questions, vague requests,
/// change/delivery requests, questions, then any other statement with a subject (explore).
pub fn decide(message_text: &str, context: &DecisionContext) -> Decision {
    use DecisionKind::{Check, Clarify, CreateIssue, Explore, Remember, Respond};
    let text = Normalized::new(message_text);
    let vague_kind = if context.recent_clarification_asked {
        Explore
    } else {
        Clarify
    };
    let vague_rationale = if context.recent_clarification_asked {
        "still vague, but a clarification was just asked: explore with what we have"
    } else {
        "no subject named: ask one clarifying question"
    };

    if text.words.is_empty() {
        return Decision::new(vague_kind, vague_rationale);
    }
    if stated_preference(message_text).is_some() {
        return Decision::new(Remember, "a lasting preference: keep it in memory");
    }
    if text.is_pleasantry() {
        return Decision::new(Respond, "greeting or thanks");
    }
    if text.is_status_question() {
        return Decision::new(Respond, "status question");
    }
    if text.is_issue_request() {
        return Decision::new(CreateIssue, "explicit request for an issue or bug report");
    }
    if text.is_check_request() {
        return Decision::new(
            Check,
            "a request to run the project's tests: run its verified test command",
        );
    }
    if context.has_summary && text.is_command_question() {
        return Decision::new(
            Respond,
            "how to run, build or test the project: answered from onboarding's commands",
        );
    }
    if text.contains_any(OVERVIEW_PHRASES) {
        return if context.has_summary {
            Decision::new(
                Respond,
                "project overview question answered from the summary",
            )
        } else {
            Decision::new(Explore, "project overview question and no summary yet")
        };
    }
    let delivery = text.is_delivery_request();
    if !text.has_subject() && !delivery {
        return Decision::new(vague_kind, vague_rationale);
    }
    if delivery || text.is_change_request() {
        return Decision::new(
            CreateIssue,
            "change or delivery request: scope it as an issue, never claim the change",
        );
    }
    if text.is_question() {
        return Decision::new(Explore, "question about the code: explore the repository");
    }
    Decision::new(Explore, "statement about the code: investigate it")
}

/// A short reply for the timeline (one to three sentences, under 50 words) saying what happens
/// next. Deterministic; varied by a hash of the input. For `Respond` it is
/// `direct_response(message_text, None)`: call [`direct_response`] with the summary instead when
/// one is mounted.
pub fn acknowledgement(decision: &Decision, message_text: &str, project_name: &str) -> String {
    let project = project_label(project_name);
    let normalized = Normalized::new(message_text);
    let topic = if normalized.contains_any(OVERVIEW_PHRASES) {
        "the overall structure".to_owned()
    } else if normalized.is_delivery_request()
        && let Some(quote) = quote(message_text)
    {
        format!("“{quote}”")
    } else {
        topic(message_text)
    };
    let seed = fnv1a(&[decision.kind.as_str(), message_text, project.as_str()]);
    let fill = |template: &str| {
        template
            .replace("{topic}", &topic)
            .replace("{project}", &project)
    };
    match decision.kind {
        DecisionKind::Respond => direct_response(message_text, None),
        DecisionKind::Clarify => clarifying_question(message_text),
        DecisionKind::Remember => stated_preference(message_text).map_or_else(
            || direct_response(message_text, None),
            |remembered| preference_acknowledgement(&remembered),
        ),
        DecisionKind::Explore => fill(pick(
            seed,
            &[
                "Got it — I'm tracing {topic} in {project} now. I'll bring back the relevant code path and the risky edges.",
                "On it. I'm reading through {project} for {topic} and will link what I find.",
                "Looking into {topic} now. I'll come back with the key files and how they connect.",
                "Sure — exploring {topic} in {project}. Expect a short summary with the evidence attached.",
            ],
        )),
        DecisionKind::Check => fill(pick(
            seed,
            &[
                "On it — I'm running {project}'s declared test command in a sandboxed copy now. I'll post how it ended.",
                "Running the test command onboarding found for {project}, confined and offline. The report follows here.",
                "Sure — {project}'s own test command is starting in a scratch copy, without network. I'll report its exit here.",
            ],
        )),
        DecisionKind::CreateIssue if normalized.is_issue_request() => fill(pick(
            seed,
            &[
                "Yep. I'm turning this into a concrete issue for {project} and checking the repository evidence before I lock the scope.",
                "Got it — drafting an issue about {topic}. I'll check the code first so the scope and acceptance criteria hold up.",
                "On it. I'll scope {topic} into an issue with the files most likely involved.",
            ],
        )),
        DecisionKind::CreateIssue => fill(pick(
            seed,
            &[
                "I can't make code changes from here yet, so I'm scoping {topic} into an issue for {project}. It will list the likely files and the next delivery step.",
                "I won't touch the code directly yet. I'm turning {topic} into a scoped issue so the work is ready to pick up.",
                "Code changes aren't made from chat yet — I'm drafting an issue for {topic} with scope and acceptance criteria instead.",
            ],
        )),
    }
}

/// The agent's own short acknowledgement while a model is still deciding
/// (`conversation.acknowledgement_deadline`): it promises nothing about
/// what comes next, only that the answer follows on the timeline.
pub fn holding_acknowledgement(message_text: &str) -> String {
    let seed = fnv1a(&["holding", message_text]);
    pick(
        seed,
        &[
            "Got it — I'm working on this now and will answer here shortly.",
            "On it. I'm reading your message and the project now; the answer follows here.",
            "Thanks — looking into this now. I'll post what I find right here.",
        ],
    )
    .to_owned()
}

/// The sentence a fallback turn adds to its visible text: the model gave
/// no usable decision (`code`), so the offline rules decided.
pub fn fallback_note(code: &str) -> String {
    format!("(The model gave no usable answer ({code}), so the built-in rules answered.)")
}

/// One question asking for the missing subject; quotes short messages back.
pub fn clarifying_question(message_text: &str) -> String {
    let quote = quote(message_text);
    let seed = fnv1a(&["clarify", message_text]);
    match quote {
        Some(quote) => pick(
            seed,
            &[
                "When you say “{quote}”, which file, feature or error do you mean?",
                "Just to be sure I look in the right place: what does “{quote}” refer to — a file, a feature or an error?",
            ],
        )
        .replace("{quote}", &quote),
        None => pick(
            seed,
            &[
                "Happy to help — what should I focus on: a file, a feature, or an error you're seeing?",
                "A file name, feature or error message is enough — which part of the project is this about?",
                "Which part of the code should I start from?",
                "Where are you seeing this — which file, page or error message?",
            ],
        )
        .to_owned(),
    }
}

/// The answer onboarding's commands in `summary` give a question about
/// running, building or testing the project, if it is one and they do.
fn onboarding_answer(text: &Normalized, summary: Option<&str>) -> Option<String> {
    if !text.is_command_question() {
        return None;
    }
    summary.and_then(|summary| commands::commands_answer(&text.words, summary))
}

/// Whether the rules answer `message_text` from onboarding's commands in
/// `summary` (the summary as the decision request quotes it): they decide
/// to respond, and the message asks how to run, build or test the project
/// and the summary lists commands for it. Such a question is answered from
/// those facts first, whatever the provider: they are what onboarding
/// verified and the setup artifact shows, and a model would have to find
/// them again (and once answered with a test helper file instead).
pub fn answers_from_onboarding(message_text: &str, summary: Option<&str>) -> bool {
    let context = DecisionContext {
        has_summary: summary.is_some(),
        recent_clarification_asked: false,
    };
    decide(message_text, &context).kind == DecisionKind::Respond
        && onboarding_answer(&Normalized::new(message_text), summary).is_some()
}

/// A direct answer for greetings, thanks, status and overview questions. With a summary, an
/// overview question is answered from its first sentence.
pub fn direct_response(message_text: &str, summary: Option<&str>) -> String {
    let text = Normalized::new(message_text);
    let seed = fnv1a(&["respond", message_text]);
    if let Some(answer) = onboarding_answer(&text, summary) {
        return answer;
    }
    if let Some(first) = summary.and_then(first_sentence)
        && (text.contains_any(OVERVIEW_PHRASES) || text.is_question())
    {
        return format!("From the project summary: {first} Ask me to dig into any part of it.");
    }
    if text.contains_any(OVERVIEW_PHRASES) {
        return "I don't have a project summary yet. Ask me to explore the repository and I'll map out its main parts."
            .to_owned();
    }
    if text.is_status_question() {
        return pick(
            seed,
            &[
                "Nothing new to report yet. I'll post here when there's something meaningful, and results land as artifact cards.",
                "I'm here. Progress shows up in the timeline, and finished results arrive as artifact cards.",
            ],
        )
        .to_owned();
    }
    let thanks = text.words.iter().any(|word| {
        matches!(
            word.as_str(),
            "thanks" | "thank" | "thx" | "ty" | "cheers" | "appreciated" | "appreciate"
        )
    });
    if thanks {
        return pick(
            seed,
            &[
                "You're welcome. I'm here if anything else comes up.",
                "Anytime — tell me what to look at next.",
                "Glad it helped. Ping me when you want to dig into something else.",
                "Happy to help — I'll be here for the next question.",
            ],
        )
        .to_owned();
    }
    let salutation = salutation(&text);
    pick(
        seed,
        &[
            "{salutation}! Ask me about any part of the repository, or ask me to draft an issue.",
            "{salutation} — I'm here. Point me at a feature, file or bug and I'll dig in.",
            "{salutation}! What would you like to look at in the code today?",
        ],
    )
    .replace("{salutation}", &salutation)
}

/// Greets back in kind: "Good morning", "Hey", ... ("Hi" by default).
fn salutation(text: &Normalized) -> String {
    if let Some(part) = text
        .words
        .iter()
        .find(|word| matches!(word.as_str(), "morning" | "afternoon" | "evening"))
    {
        return format!("Good {part}");
    }
    let word = text
        .words
        .iter()
        .find(|word| {
            matches!(
                word.as_str(),
                "hi" | "hello" | "hey" | "heya" | "hiya" | "howdy"
            )
        })
        .map_or("hi", String::as_str);
    let mut chars = word.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

fn clip_chars(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

fn pick<'a>(seed: u64, choices: &[&'a str]) -> &'a str {
    let len = u64::try_from(choices.len()).unwrap_or(1).max(1);
    let index = usize::try_from(seed % len).unwrap_or(0);
    choices.get(index).copied().unwrap_or_default()
}

/// FNV-1a over the parts (separated), stable across runs, platforms and Rust versions.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain(std::iter::once(0xff)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The offline rules as a [`Provider`]: answers a decision request with exactly one decision
/// tool call (`respond`, `clarify`, `explore` or `create_issue`) carrying the rules' wording, and
/// the rule that fired as its content. Never calls the network; fails only on a request that is
/// not the agent's decision request.
#[derive(Clone, Copy, Debug, Default)]
pub struct OfflineRules;

impl OfflineRules {
    /// The deterministic reply to `request`.
    pub fn reply(&self, request: &ChatRequest) -> Result<ChatReply, Error> {
        request.validate()?;
        let prompt = DecisionPrompt::parse(request).ok_or_else(|| Error::InvalidRequest {
            reason: "the offline rules answer only the conversation's decision request".to_owned(),
        })?;
        let context = DecisionContext {
            has_summary: prompt.summary.is_some(),
            recent_clarification_asked: prompt.clarification_just_asked,
        };
        let text = prompt.message.as_str();
        let decision = decide(text, &context);
        let (name, arguments) = match decision.kind {
            DecisionKind::Respond => (
                "respond",
                json!({"message": direct_response(text, prompt.summary.as_deref())}),
            ),
            DecisionKind::Clarify => ("clarify", json!({"question": clarifying_question(text)})),
            DecisionKind::Remember => {
                let remembered = stated_preference(text).ok_or_else(|| Error::InvalidRequest {
                    reason: "the remember rule fired on a message without a preference".to_owned(),
                })?;
                let acknowledgement = preference_acknowledgement(&remembered);
                (
                    "remember",
                    json!({"key": remembered.key, "preference": remembered.value, "acknowledgement": acknowledgement}),
                )
            }
            DecisionKind::Explore | DecisionKind::CreateIssue | DecisionKind::Check => {
                let action = Action::from_offline(decision.kind);
                json_flow_call(
                    decision.kind.as_str(),
                    acknowledgement(&decision, text, &prompt.project),
                    work_title(action, text),
                    text.trim(),
                )
            }
        };
        Ok(ChatReply {
            content: Some(decision.rationale),
            tool_calls: vec![ToolCall {
                id: format!("{OFFLINE_LABEL}-{name}"),
                name: name.to_owned(),
                arguments,
            }],
            finish_reason: FinishReason::ToolCalls,
            usage: Usage::default(),
            attempts: 1,
            model: OFFLINE_MODEL.to_owned(),
            provider_label: OFFLINE_LABEL.to_owned(),
        })
    }
}

fn json_flow_call(
    name: &'static str,
    acknowledgement: String,
    title: String,
    request: &str,
) -> (&'static str, serde_json::Value) {
    (
        name,
        json!({"acknowledgement": acknowledgement, "title": title, "request": request}),
    )
}

impl Provider for OfflineRules {
    fn label(&self) -> &str {
        OFFLINE_LABEL
    }

    fn is_deterministic(&self) -> bool {
        true
    }

    fn complete(&self, request: ChatRequest) -> BoxFuture<'_, Result<ChatReply, Error>> {
        Box::pin(std::future::ready(self.reply(&request)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::decision_request;
    use crate::state::{ProjectView, TimelineEntry, entry};
    use DecisionKind::{Check, Clarify, CreateIssue, Explore, Respond};

    const FRESH: DecisionContext = DecisionContext {
        has_summary: false,
        recent_clarification_asked: false,
    };

    /// Realistic messages and the action expected with no summary and no recent clarification.
    const TABLE: &[(&str, DecisionKind)] = &[
        ("hi", Respond),
        ("Good morning team!", Respond),
        ("thanks, that's great", Respond),
        ("ok cool thanks a lot", Respond),
        ("thanks for the help", Respond),
        ("hi, can you help?", Clarify),
        ("what's the status?", Respond),
        ("any update on the exploration?", Respond),
        ("are you there?", Respond),
        ("How does authentication work in this repo?", Explore),
        ("Where is the retry logic for webhooks?", Explore),
        ("why is the build failing on CI?", Explore),
        ("What does the `SessionStore` do?", Explore),
        (
            "walk me through the request lifecycle in packages/server",
            Explore,
        ),
        ("The login page is slow when many users sign in", Explore),
        ("what does this project do?", Explore),
        ("can you look into the flaky payment tests", Explore),
        ("Create an issue for the flaky payment tests", CreateIssue),
        (
            "please draft a ticket about rate limiting the public API",
            CreateIssue,
        ),
        (
            "file a bug: uploads over 10MB crash the worker",
            CreateIssue,
        ),
        ("write a bug report for the broken CSV export", CreateIssue),
        ("can you turn this into an issue?", CreateIssue),
        ("fix the null pointer in parse_config", CreateIssue),
        (
            "Please refactor the billing module to use the new client",
            CreateIssue,
        ),
        ("add dark mode to the settings page", CreateIssue),
        ("commit and push", CreateIssue),
        ("deploy it to staging", CreateIssue),
        ("can you open a PR that bumps tokio", CreateIssue),
        ("run the tests", Check),
        ("how do I run the tests?", Explore),
        ("Can you run the tests please?", Check),
        ("Write an issue: run tests in CI", CreateIssue),
        ("do the tests pass?", Check),
        ("fix it", Clarify),
        ("help", Clarify),
        ("it's broken", Clarify),
        ("can you look at this?", Clarify),
        ("how does it work?", Clarify),
        ("why?", Clarify),
        ("", Clarify),
    ];

    #[test]
    fn decide_on_realistic_messages() {
        for (message, expected) in TABLE {
            let decision = decide(message, &FRESH);
            assert_eq!(
                decision.kind, *expected,
                "{message:?}: {}",
                decision.rationale
            );
            assert!(!decision.rationale.is_empty());
        }
    }

    #[test]
    fn lasting_preferences_are_kept_under_their_topic_and_questions_are_not() {
        let kept = |text: &str| stated_preference(text).map(|kept| (kept.key, kept.value));
        assert_eq!(
            kept("From now on, answer in German please."),
            Some(("preference.language".into(), "Answer in German".into()))
        );
        assert_eq!(
            kept("Always reply in french"),
            Some(("preference.language".into(), "Answer in French".into()))
        );
        assert_eq!(
            kept("Going forward, skip tests in issue drafts"),
            Some((
                "preference.issue-tests".into(),
                "Skip tests in issue drafts".into()
            ))
        );
        let (key, value) = kept("Remember that our staging branch is called develop").unwrap();
        assert!(key.starts_with("preference.") && key.len() == "preference.".len() + 8);
        assert_eq!(value, "Remember that our staging branch is called develop");
        zopu_core::memory::check_key(&key).unwrap();
        for not_one in [
            "do you always answer in German?",
            "How does the retry logic work?",
            "answer in German",
            "From now on use token ghp_0123456789abcdefghijklmnopqrstuvwxyzAB",
            "From now on, my password is hunter2",
            "Remember that the staging PIN is 4821",
            "Always log in as admin with password letmein",
            "Create an issue for the flaky payment tests",
        ] {
            assert_eq!(kept(not_one), None, "{not_one}");
        }
        assert_eq!(
            decide("From now on, answer in German", &FRESH).kind,
            DecisionKind::Remember
        );
        for text in [
            "From now on, answer in German",
            "Always skip tests in issue drafts",
            "Remember that CI is slow",
        ] {
            let ack = preference_acknowledgement(&stated_preference(text).unwrap());
            crate::decide::check_agent_text(&ack, crate::decide::ACK_MAX_WORDS).unwrap();
        }
    }

    #[test]
    fn never_clarifies_twice_in_a_row() {
        let context = DecisionContext {
            recent_clarification_asked: true,
            ..FRESH
        };
        for (message, expected) in TABLE {
            let kind = decide(message, &context).kind;
            let expected = if *expected == Clarify {
                Explore
            } else {
                *expected
            };
            assert_eq!(kind, expected, "{message:?}");
        }
    }

    #[test]
    fn overview_is_answered_from_the_summary_when_there_is_one() {
        let context = DecisionContext {
            has_summary: true,
            ..FRESH
        };
        assert_eq!(decide("what does this project do?", &context).kind, Respond);
        let response = direct_response(
            "what does this project do?",
            Some("# Acme\n\nAcme is a billing service written in Go. It talks to Stripe."),
        );
        assert!(
            response.contains("Acme is a billing service written in Go."),
            "{response}"
        );
        assert!(!response.contains("Stripe"), "{response}");
        // summary.md as onboarding writes it: a heading, an italic note on
        // who wrote it, then the purpose quoted from the README.
        let response = direct_response(
            "what does this project do?",
            Some(
                "# Acme — repository summary\n\n_Written by the Zopu onboarding flow (provider: offline, heuristic) at commit `abc`. Facts were read from the repository._\n\n## Project purpose\n\n> Acme bills customers every month.\n\n(quoted from `README.md`)\n",
            ),
        );
        assert_eq!(
            response,
            "From the project summary: Acme bills customers every month. Ask me to dig into any part of it."
        );
    }

    fn sentences(text: &str) -> usize {
        text.split_inclusive(['.', '!', '?'])
            .filter(|part| part.chars().any(char::is_alphanumeric))
            .count()
    }

    #[test]
    fn acknowledgements_are_short_deterministic_and_honest() {
        let forbidden = [
            "i changed",
            "i've changed",
            "i fixed",
            "i've fixed",
            "fixed it",
            "deployed",
            "pushed",
            "committed",
            "merged",
            "shipped",
            "tested",
            "i've updated",
            "i updated",
            "done.",
        ];
        for context in [
            FRESH,
            DecisionContext {
                recent_clarification_asked: true,
                has_summary: true,
            },
        ] {
            let mut previous = String::new();
            for (message, _) in TABLE {
                let decision = decide(message, &context);
                let ack = acknowledgement(&decision, message, "acme-payments");
                assert_eq!(
                    ack,
                    acknowledgement(&decision, message, "acme-payments"),
                    "deterministic"
                );
                let words = ack.split_whitespace().count();
                assert!(words > 0 && words < 50, "{words} words: {ack}");
                assert!((1..=3).contains(&sentences(&ack)), "{ack}");
                let lower = ack.to_lowercase();
                for phrase in forbidden {
                    assert!(!lower.contains(phrase), "{message:?} -> {ack}");
                }
                assert_ne!(ack, previous, "consecutive acknowledgements repeat: {ack}");
                previous = ack;
            }
        }
    }

    /// "How do I run the tests?" is answered with the test command
    /// onboarding found (the setup artifact shows the same), not by an
    /// exploration that lands on a test helper file.
    #[test]
    fn run_build_and_test_questions_are_answered_from_onboardings_commands() {
        let summary = "# shop — repository summary\n\n## Project purpose\n\nA shop.\n\n\
            ## Likely run/build/test commands\n\n\
            - `cargo build` — build the workspace — **verified** — Cargo.toml\n\
            - `cargo test` — run the tests — *inferred* — Cargo convention; not run\n\
            - `make test` — test — **verified** — declared in Makefile line 21\n\n\
            ## Root .env.example variable names\n\n- None found.\n";
        let with_summary = DecisionContext {
            has_summary: true,
            recent_clarification_asked: false,
        };
        for question in [
            "How do I run the tests?",
            "how to build it",
            "What's the test command?",
            "Which command builds it?",
        ] {
            let decision = decide(question, &with_summary);
            assert_eq!(decision.kind, DecisionKind::Respond, "{question}");
        }
        let answer = direct_response("How do I run the tests?", Some(summary));
        assert_eq!(
            answer,
            "From what onboarding found: `make test` (test; verified: declared in Makefile line 21); \
             `cargo test` (run the tests; inferred: Cargo convention; not run); \
             `cargo build` (build the workspace; verified: Cargo.toml). \
             Say \"run the tests\" and I'll run the test command in a sandboxed copy."
        );
        let build = direct_response("How do I build it?", Some(summary));
        assert!(
            build.starts_with(
                "From what onboarding found: `cargo build` (build the workspace; verified"
            ),
            "{build}"
        );
        // Before onboarding there is nothing to answer from: explore.
        assert_ne!(
            decide("How do I run the tests?", &FRESH).kind,
            DecisionKind::Respond
        );
        // Questions about the tests' code are still explored.
        for question in [
            "How are the tests organized?",
            "How does the test runner work?",
        ] {
            assert_ne!(
                decide(question, &with_summary).kind,
                DecisionKind::Respond,
                "{question}"
            );
        }
        // "Run the tests" is still a request to run them.
        assert_eq!(
            decide("Run the tests", &with_summary).kind,
            DecisionKind::Check
        );
    }

    #[test]
    fn acknowledgement_mentions_the_topic_and_survives_long_names() {
        let message = "How does the webhook retry queue work?";
        let decision = decide(message, &FRESH);
        let ack = acknowledgement(&decision, message, "acme");
        assert!(ack.contains("webhook"), "{ack}");
        let long_name = "a ".repeat(200);
        let ack = acknowledgement(&decision, message, &long_name);
        assert!(ack.split_whitespace().count() < 50, "{ack}");
    }

    #[test]
    fn the_topic_of_a_change_request_is_what_changes_not_the_verb() {
        assert_eq!(
            topic("Write an issue: add a zopu token revoke command"),
            "zopu token revoke"
        );
        assert_eq!(topic("Fix the flaky payment tests"), "flaky payment tests");
        // A verb alone is still the subject when nothing else is named.
        assert_eq!(topic("refactor"), "refactor");
    }

    #[test]
    fn clarifying_question_is_one_short_question() {
        for message in [
            "fix it",
            "help",
            "it's broken",
            "can you look at this?",
            "why?",
            "",
        ] {
            let question = clarifying_question(message);
            assert!(question.ends_with('?'), "{question}");
            assert!(question.split_whitespace().count() < 30, "{question}");
        }
    }

    fn view(summary: Option<&str>, just_asked: bool) -> ProjectView {
        let recent = if just_asked {
            vec![TimelineEntry {
                sequence: 1,
                kind: entry::QUESTION.into(),
                text: "Which part?".into(),
                dispatch_id: "earlier".into(),
            }]
        } else {
            Vec::new()
        };
        ProjectView {
            repository_url: "https://github.com/acme/acme-payments.git".into(),
            summary: summary.map(str::to_owned),
            recent,
            enabled: true,
            ..Default::default()
        }
    }

    /// The provider's tool call carries exactly the rules' wording for every
    /// message of the table, with and without a summary or a question just asked.
    #[test]
    fn the_provider_answers_a_decision_request_with_the_rules_wording() {
        let summary = "# Acme\n\nAcme is a billing service written in Go. It talks to Stripe.";
        for (has_summary, just_asked) in [(false, false), (true, false), (false, true)] {
            let view = view(has_summary.then_some(summary), just_asked);
            let context = DecisionContext {
                has_summary,
                recent_clarification_asked: just_asked,
            };
            for (message, _) in TABLE
                .iter()
                .chain(&[("what does this project do?", Respond)])
            {
                let request = decision_request(
                    message,
                    &view,
                    "this-dispatch",
                    &crate::decide::built_in_definition(),
                );
                let reply = OfflineRules.reply(&request).expect("a decision request");
                assert_eq!(
                    reply,
                    OfflineRules.reply(&request).expect("again"),
                    "deterministic"
                );
                let decision = decide(message, &context);
                assert_eq!(reply.content.as_deref(), Some(decision.rationale.as_str()));
                assert_eq!(reply.provider_label, OFFLINE_LABEL);
                let [call] = reply.tool_calls.as_slice() else {
                    panic!("{message:?}: one tool call expected");
                };
                assert_eq!(call.name, decision.kind.as_str(), "{message:?}");
                let expected = match decision.kind {
                    Respond => {
                        json!({"message": direct_response(message, view.summary.as_deref())})
                    }
                    Clarify => json!({"question": clarifying_question(message)}),
                    DecisionKind::Remember => {
                        let kept = stated_preference(message).unwrap();
                        json!({"key": kept.key, "preference": kept.value, "acknowledgement": preference_acknowledgement(&kept)})
                    }
                    Explore | CreateIssue | Check => json!({
                        "acknowledgement": acknowledgement(&decision, message, "acme-payments"),
                        "title": work_title(Action::from_offline(decision.kind), message),
                        "request": message.trim(),
                    }),
                };
                assert_eq!(call.arguments, expected, "{message:?}");
            }
        }
    }

    #[test]
    fn the_provider_refuses_what_is_not_a_decision_request() {
        let request = ChatRequest::new(vec![zopu_llm::ChatMessage::user("How does auth work?")]);
        assert!(matches!(
            OfflineRules.reply(&request),
            Err(Error::InvalidRequest { .. })
        ));
        assert!(OfflineRules.is_deterministic());
        assert_eq!(OfflineRules.label(), "offline");
    }
}
