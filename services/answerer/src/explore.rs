//! Exploration (main spec section 30) with the offline provider: frame the
//! question as keywords, search, rank files by match density and path
//! relevance, read the top hits, verify the evidence, and say honestly what
//! is heuristic and what is unknown. [`gather`] builds a question's
//! workspace index through the port and is shared with the issue flow;
//! [`explore`] wraps the pure drafting of [`crate::draft`] with the port's
//! calls.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use zopu_core::keywords::code_forms;
use zopu_runtime::text::clip_chars;

use regex::Regex;
use zopu_sandbox::tools::{FindCodeInput, ListFilesInput, ReadFileInput, SearchInput};
use zopu_schema::pb::FlowPhase;

use crate::draft::{self, TOP_FILES};
use crate::grounding;
use crate::port::{self, FlowError, Port};
use crate::results::ExplorationResult;

mod blend;
mod findings;
mod roles;

use blend::{INDEX_FILES, blend, follow_imports, follow_links, index_query, named_in};
pub use findings::{findings, system_map};
pub use roles::{FileRole, role_of};

/// Most keywords searched.
const KEYWORDS_MAX: usize = 6;
/// Matches asked for per keyword.
const MATCHES_PER_KEYWORD: usize = 300;
/// Matches kept per file and keyword: a keyword that many files mention
/// still reaches them all before the cap.
const MATCHES_PER_FILE: usize = 12;
/// Lines read around the first match.
const WINDOW_LINES: u64 = 60;

/// Words that carry no subject in a repository question.
const GENERIC: &[&str] = &[
    "code",
    "file",
    "files",
    "repo",
    "repository",
    "work",
    "works",
    "does",
    "explore",
    "explain",
    "find",
    "where",
    "how",
    "what",
    "why",
    "issue",
    "create",
    "make",
    "should",
    "would",
    "could",
    "please",
];

/// Quoted messages taken as keywords, at most (the rest of the question
/// keeps its say).
const QUOTED_MESSAGES_MAX: usize = 2;

/// The parts of `text` between an opening and a closing delimiter (an
/// unclosed one quotes nothing).
fn quoted<'a>(text: &'a str, delimiters: &[char]) -> Vec<&'a str> {
    let parts: Vec<&str> = text.split(delimiters).collect();
    let closed = parts.len().saturating_sub(1);
    parts[..closed].iter().skip(1).step_by(2).copied().collect()
}

/// The search terms of a question: identifiers and paths quoted in it
/// verbatim (in backticks), messages quoted in it ("Did you mean ...?", the
/// words before an ellipsis), the names code gives the phrases it holds
/// ([`NAMED_PHRASES`]: `choices` for "allowed values"), then the request's
/// ranked subject words (`zopu_core::keywords`).
pub fn keywords(question: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let backticked = quoted(question, &['`']);
    // Messages: double-quoted runs of words, looked for outside backticks;
    // an ellipsis stands for what varies (the longest part is kept).
    let outside_backticks: String = question.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    let messages: Vec<&str> = quoted(&outside_backticks, &['"', '“', '”'])
        .into_iter()
        .filter_map(|quoted| {
            quoted
                .split("...")
                .flat_map(|part| part.split('…'))
                .map(|part| {
                    part.trim().trim_end_matches(|c: char| {
                        c.is_whitespace() || matches!(c, '?' | '.' | '!' | ':' | ',')
                    })
                })
                .max_by_key(|part| part.len())
        })
        .filter(|message| message.contains(' '))
        .take(QUOTED_MESSAGES_MAX)
        .collect();
    for quoted in backticked.iter().chain(messages.iter()) {
        let quoted = quoted.trim();
        if (3..=60).contains(&quoted.len()) && !out.iter().any(|known| known == quoted) {
            out.push(quoted.to_owned());
        }
    }
    for name in named_in(question) {
        if !out.iter().any(|known| known == name) {
            out.push(name.to_owned());
        }
    }
    for keyword in zopu_core::keywords::keywords(question) {
        if keyword.chars().count() >= 3
            && !GENERIC.contains(&keyword.as_str())
            && !out.iter().any(|k| k.eq_ignore_ascii_case(&keyword))
        {
            out.push(keyword);
        }
    }
    if out.is_empty() {
        out = question
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|word| word.len() >= 4 && !GENERIC.contains(&word.to_lowercase().as_str()))
            .map(str::to_lowercase)
            .collect();
    }
    let mut seen = BTreeSet::new();
    out.retain(|k| seen.insert(k.to_lowercase()));
    out.truncate(KEYWORDS_MAX);
    out
}

/// Whether a keyword is a phrase the question quotes: only quoted
/// keywords hold spaces (a message in double quotes, a command in
/// backticks; [`keywords`] keeps a quoted message only if it is words).
fn is_quoted_phrase(keyword: &str) -> bool {
    keyword.contains(' ')
}

/// One file and why it ranked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankedFile {
    pub path: String,
    pub score: f64,
    /// (line, text, keyword)
    pub matches: Vec<(u64, String, String)>,
    pub keywords: BTreeSet<String>,
    pub path_hits: u32,
    pub size_bytes: u64,
    /// The code index's score for the question (0 when it did not rank the file).
    pub index_score: f64,
    /// What the code index says the file defines of the question's words: (line, name).
    pub defines: Vec<(u64, String)>,
    /// The line the code index found holding several of the question's words.
    pub best_line: Option<u64>,
    /// Files of the index's ranking it imports or that import it.
    pub linked: BTreeSet<String>,
}

/// What a search round found.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    pub keywords: Vec<String>,
    pub ranked: Vec<RankedFile>,
    /// Keywords nothing matched.
    pub unmatched: Vec<String>,
    /// Keywords whose search hit the match cap.
    pub capped: Vec<String>,
    /// The read windows of the top files: path → (first line, content).
    pub windows: BTreeMap<String, (u64, String)>,
}

/// What the question asks about besides behaviour: tests, docs, changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asks {
    pub tests: bool,
    /// It asks for tests by name ("which tests cover ...", "where are the
    /// specs for ..."), not only about testing: a test is the answer.
    pub for_tests: bool,
    pub docs: bool,
    pub changes: bool,
    pub examples: bool,
}

impl Asks {
    /// From the question's keywords.
    pub fn of(keywords: &[String]) -> Self {
        let any = |words: &[&str]| {
            keywords
                .iter()
                .any(|k| words.iter().any(|w| k.eq_ignore_ascii_case(w)))
        };
        Self {
            tests: any(&[
                "test", "tests", "testing", "spec", "specs", "flaky", "fixture", "fixtures",
            ]),
            for_tests: any(&["test", "tests", "spec", "specs"]),
            docs: any(&[
                "doc",
                "docs",
                "documentation",
                "readme",
                "documented",
                "guide",
            ]),
            examples: any(&["example", "examples", "sample", "samples", "demo"]),
            changes: any(&[
                "changelog",
                "release",
                "releases",
                "changes",
                "history",
                "version",
            ]),
        }
    }
}

fn weight_of(path: &str, asks: Asks) -> f64 {
    match role_of(path) {
        FileRole::Lock => 0.2,
        FileRole::Changelog if asks.changes => 1.0,
        FileRole::Changelog => 0.3,
        FileRole::Docs if asks.docs => 1.0,
        FileRole::Docs => 0.45,
        FileRole::Tests if asks.tests => 1.0,
        FileRole::Tests => 0.55,
        FileRole::Examples if asks.examples => 1.0,
        FileRole::Examples => 0.45,
        FileRole::Auxiliary => 0.5,
        // "Which tests cover ...": the answer is a test, the source it
        // exercises only context.
        // A source file named after testing is a testing helper: one of
        // the answers.
        FileRole::Source if asks.for_tests && !path.to_lowercase().contains("test") => 0.5,
        FileRole::Source => 1.0,
    }
}

/// How many of a file's keywords it defines: a matching line declares a
/// name that contains the keyword's search root.
fn defined_keywords(matches: &[(u64, String, String)]) -> usize {
    let Some(re) = DEFINITION.as_ref() else {
        return 0;
    };
    let defined: BTreeSet<&str> = matches
        .iter()
        .filter(|(_, text, keyword)| {
            let forms = code_forms(&keyword.to_lowercase());
            re.captures_iter(text).any(|captures| {
                let name = captures[2].to_lowercase();
                forms.iter().any(|form| name.contains(form.as_str()))
            })
        })
        .map(|(_, _, keyword)| keyword.as_str())
        .collect();
    defined.len()
}

/// Best score first; equal scores in path order.
fn sort_ranked(ranked: &mut [RankedFile]) {
    ranked.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| a.path.cmp(&b.path))
    });
}

/// Ranks files by keyword coverage, what they define, the phrases the
/// question quotes that they hold, match density and path relevance; tests, docs and changelogs count for less unless the
/// question asks about them.
pub fn rank(
    keywords: &[String],
    hits: &[(String, u64, String)],
    sizes: &BTreeMap<String, u64>,
    paths: &[String],
) -> Vec<RankedFile> {
    let mut files: BTreeMap<String, RankedFile> = BTreeMap::new();
    for (keyword, line, text) in hits {
        // `hits` holds (keyword, line, "path\u{0}text") to keep one tuple type.
        let Some((path, text)) = text.split_once('\u{0}') else {
            continue;
        };
        let file = files.entry(path.to_owned()).or_insert_with(|| RankedFile {
            path: path.to_owned(),
            ..Default::default()
        });
        file.keywords.insert(keyword.clone());
        if !file.matches.iter().any(|(l, _, _)| l == line) {
            file.matches.push((*line, text.to_owned(), keyword.clone()));
        }
    }
    for path in paths {
        let lower = path.to_lowercase();
        let hits = keywords
            .iter()
            .filter(|k| {
                code_forms(&k.to_lowercase())
                    .iter()
                    .any(|form| lower.contains(form.as_str()))
            })
            .count() as u32;
        if hits > 0 {
            files
                .entry(path.clone())
                .or_insert_with(|| RankedFile {
                    path: path.clone(),
                    ..Default::default()
                })
                .path_hits = hits;
        }
    }
    let asks = Asks::of(keywords);
    // A keyword few files mention says more about a file than one most
    // files mention: coverage counts each keyword by its rarity (inverse
    // document frequency, 1 on average over the question's keywords).
    let total = files.len().max(paths.len()).max(1) as f64;
    let rarity: BTreeMap<&String, f64> = keywords
        .iter()
        .map(|keyword| {
            let mentioning = files
                .values()
                .filter(|file| file.keywords.contains(keyword))
                .count()
                .max(1) as f64;
            (keyword, (1.0 + total / mentioning).ln())
        })
        .collect();
    let mean_rarity = if rarity.is_empty() {
        1.0
    } else {
        rarity.values().sum::<f64>() / rarity.len() as f64
    };
    let mut ranked: Vec<RankedFile> = files
        .into_values()
        .map(|mut file| {
            file.size_bytes = sizes.get(&file.path).copied().unwrap_or(0);
            let lines = (file.size_bytes / 40).max(10) as f64;
            let count = file.matches.len() as f64;
            let density = (count / lines).min(1.0);
            let coverage: f64 = file
                .keywords
                .iter()
                .map(|keyword| rarity.get(keyword).copied().unwrap_or(mean_rarity))
                .sum::<f64>()
                / mean_rarity;
            // What the file defines (a function, type, ... named after a
            // keyword) weighs more than what it only mentions.
            let defined = defined_keywords(&file.matches) as f64;
            // A phrase the question quotes, found verbatim: where that
            // message or line lives.
            let phrases = file
                .keywords
                .iter()
                .filter(|keyword| is_quoted_phrase(keyword))
                .count() as f64;
            file.score = (3.0 * coverage
                + 1.5 * (1.0 + count).ln()
                + 4.0 * density
                + 2.0 * f64::from(file.path_hits)
                + 4.0 * defined
                + 8.0 * phrases)
                * weight_of(&file.path, asks);
            file.matches.sort_by_key(|(line, _, _)| *line);
            file
        })
        .collect();
    sort_ranked(&mut ranked);
    ranked
}

/// Searches `keywords`, ranks the files and reads the top `top` of them.
pub async fn gather<P: Port>(
    port: &mut P,
    step: &str,
    question: &str,
    keywords: &[String],
    top: usize,
) -> Result<Gathered, FlowError> {
    let mut gathered = Gathered {
        keywords: keywords.to_vec(),
        ..Default::default()
    };
    let mut hits: Vec<(String, u64, String)> = Vec::new();
    for (index, keyword) in keywords.iter().enumerate() {
        let (pattern, literal) = search_pattern(keyword);
        let input = SearchInput {
            pattern,
            literal,
            case_insensitive: true,
            path: String::new(),
            max_matches: Some(MATCHES_PER_KEYWORD),
            max_matches_per_file: Some(MATCHES_PER_FILE),
        };
        let output = match port::search(port, &format!("{step}:search:{index}"), input).await? {
            Ok(output) => output,
            Err(_) => {
                gathered.unmatched.push(keyword.clone());
                continue;
            }
        };
        if output.truncated {
            gathered.capped.push(keyword.clone());
        }
        let mut matched = false;
        for found in output.matches {
            if found
                .path
                .split('/')
                .any(|c| matches!(c, "node_modules" | "target" | "dist" | "vendor" | ".zopu"))
            {
                continue;
            }
            matched = true;
            hits.push((
                keyword.clone(),
                found.line_number,
                format!("{}\u{0}{}", found.path, found.line),
            ));
        }
        if !matched {
            gathered.unmatched.push(keyword.clone());
        }
    }
    let listing = port::list_files(
        port,
        &format!("{step}:list"),
        ListFilesInput {
            path: String::new(),
            max_depth: Some(12),
            max_entries: Some(5_000),
        },
    )
    .await?;
    let (paths, sizes): (Vec<String>, BTreeMap<String, u64>) = match listing {
        Ok(listing) => {
            let files: Vec<_> = listing
                .entries
                .into_iter()
                .filter(|e| e.kind == zopu_sandbox::tools::EntryKind::File)
                .collect();
            (
                files.iter().map(|e| e.path.clone()).collect(),
                files
                    .iter()
                    .map(|e| (e.path.clone(), e.size_bytes))
                    .collect(),
            )
        }
        Err(_) => (Vec::new(), BTreeMap::new()),
    };
    let paths: Vec<String> = paths
        .into_iter()
        .filter(|p| {
            !p.split('/')
                .any(|c| matches!(c, "node_modules" | "target" | "dist" | "vendor"))
        })
        .collect();
    gathered.ranked = rank(keywords, &hits, &sizes, &paths);
    let asks = Asks::of(keywords);
    let indexed = port::find_code(
        port,
        &format!("{step}:index"),
        FindCodeInput {
            query: index_query(question),
            max_files: Some(INDEX_FILES),
        },
    )
    .await?;
    if let Ok(indexed) = indexed {
        blend(&mut gathered.ranked, &indexed.files, asks);
    }
    follow_links(port, step, &mut gathered.ranked).await?;
    follow_imports(&mut gathered.ranked, asks);
    gathered.unmatched.retain(|k| {
        !gathered
            .ranked
            .iter()
            .any(|f| f.path.to_lowercase().contains(&k.to_lowercase()))
    });
    for (index, file) in gathered.ranked.iter().take(top).enumerate() {
        // The window shows the line that holds the question's words
        // together, else the first match, else the first definition.
        let first = file
            .best_line
            .or_else(|| file.matches.first().map(|(line, _, _)| *line))
            .or_else(|| file.defines.first().map(|(line, _)| *line))
            .unwrap_or(1);
        let start = first.saturating_sub(5).max(1);
        let input = ReadFileInput {
            path: file.path.clone(),
            start_line: Some(start),
            end_line: Some(start + WINDOW_LINES),
            ..Default::default()
        };
        if let Ok(read) = port::read_file(port, &format!("{step}:read:{index}"), input).await?
            && !read.binary
        {
            gathered
                .windows
                .insert(file.path.clone(), (read.start_line, read.content));
        }
    }
    Ok(gathered)
}

/// What to search for a keyword: the keyword itself, literally, or with
/// the abbreviations code uses for it (`environment|env`) and the plural a
/// `y` stem comes from (`cooky|cookie`: "cookies" stems to `cooky`, which
/// no code holds; `entry|entrie`), as a regex.
fn search_pattern(keyword: &str) -> (String, bool) {
    let mut forms = code_forms(&keyword.to_lowercase());
    forms.extend(plural_of_y_stem(keyword));
    if forms.len() == 1 {
        return (keyword.to_owned(), true);
    }
    let alternatives: Vec<String> = std::iter::once(keyword.to_owned())
        .chain(forms.into_iter().skip(1))
        .map(|form| regex::escape(&form))
        .collect();
    (alternatives.join("|"), false)
}

/// `cooky` → `cookie`, `entry` → `entrie`: what a lowercase stem ending
/// in a consonant and `y` is spelled as before `s`.
fn plural_of_y_stem(stem: &str) -> Option<String> {
    let body = stem.strip_suffix('y')?;
    let last = body.chars().last()?;
    (body.chars().count() >= 3
        && body.chars().all(|c| c.is_ascii_lowercase())
        && !matches!(last, 'a' | 'e' | 'i' | 'o' | 'u'))
    .then(|| format!("{body}ie"))
}

static DEFINITION: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"\b(fn|def|class|struct|func|function|interface|type|enum|trait|const|let|var|impl|mod|async function)\s+([A-Za-z_][A-Za-z0-9_]*)").ok()
});

/// Definitions in a window whose names contain a keyword: (line, name, line text).
pub fn definitions(window: &(u64, String), keywords: &[String]) -> Vec<(u64, String, String)> {
    let Some(re) = DEFINITION.as_ref() else {
        return Vec::new();
    };
    let (first, content) = window;
    let mut out = Vec::new();
    for (offset, line) in content.lines().enumerate() {
        for captures in re.captures_iter(line) {
            let name = captures[2].to_owned();
            let lower = name.to_lowercase();
            if keywords.iter().any(|k| {
                code_forms(&k.to_lowercase())
                    .iter()
                    .any(|form| lower.contains(form.as_str()))
            }) {
                out.push((first + offset as u64, name, clip_chars(line.trim(), 200)));
            }
        }
    }
    out.truncate(4);
    out
}

/// What exploration starts from.
#[derive(Debug, Clone, Default)]
pub struct ExploreInput {
    pub question: String,
    pub provider: String,
    pub repository_commit: String,
}

/// Search rounds at most: the question's keywords, then once with
/// broader terms if they matched nothing ([`draft::broader_terms`]).
const ROUNDS_MAX: u32 = 2;

/// Offline exploration through `port`: the port's calls around the pure
/// interface of [`crate::draft`]. The question's keywords are searched
/// ([`gather`], steps `explore:{round}:…`), once more with broader terms if
/// nothing matched, the answer is drafted ([`draft::draft`]), its evidence
/// checked (steps `verify:…`) and the draft finished ([`draft::finish`]).
pub async fn explore<P: Port>(
    port: &mut P,
    input: &ExploreInput,
) -> Result<ExplorationResult, FlowError> {
    port.phase(FlowPhase::Plan, 1, "Framing the question")
        .await?;
    let mut terms = keywords(&input.question);
    let mut round = 1;
    let gathered = loop {
        port.phase(FlowPhase::Act, round, "Searching the repository")
            .await?;
        let gathered = gather(
            port,
            &format!("explore:{round}"),
            &input.question,
            &terms,
            TOP_FILES,
        )
        .await?;
        port.phase(FlowPhase::Reflect, round, "Checking the matches")
            .await?;
        match draft::broader_terms(&gathered) {
            Some(broader) if round < ROUNDS_MAX => {
                terms = broader;
                round += 1;
            }
            _ => break gathered,
        }
    };
    let drafted = draft::draft(&input.question, &gathered);
    let grounded = grounding::verify_tagged(port, "verify", drafted.evidence()).await?;
    Ok(draft::finish(drafted, grounded.kept, input))
}

#[cfg(test)]
mod tests {
    use zopu_sandbox::tools::FoundFile;

    use super::blend::whole_word;
    use super::*;

    #[test]
    fn the_index_is_asked_the_question_and_its_short_forms() {
        let query = super::index_query("Where is the data directory read from the command line?");
        assert!(
            query.starts_with("Where is the data directory read from the command line? cli "),
            "{query}"
        );
        assert!(query.contains("data dir"), "{query}");
        assert!(query.contains("cmd line"), "{query}");
        let query = super::index_query("Why is a script starting with `#!` made executable?");
        assert!(query.ends_with(" shebang"), "{query}");
        // A value given on the command line is about what reads it.
        let query =
            super::index_query("What if the entry files I pass on the command line match nothing?");
        let words =
            |query: &str| -> Vec<String> { query.split_whitespace().map(str::to_owned).collect() };
        assert!(!words(&query).contains(&"cli".to_owned()), "{query}");
        let query = super::index_query("Where are the command-line options tested?");
        assert!(words(&query).contains(&"cli".to_owned()), "{query}");
        // Nothing to shorten: the question alone.
        assert_eq!(
            super::index_query("How are routes matched?"),
            "How are routes matched?"
        );
    }

    /// A direct port that notes each phase and tool step.
    struct Steps {
        port: crate::port::DirectPort,
        steps: Vec<String>,
    }

    impl Port for Steps {
        async fn phase(
            &mut self,
            phase: FlowPhase,
            iteration: u32,
            note: &str,
        ) -> Result<(), FlowError> {
            self.steps.push(format!("{phase:?} {iteration}"));
            self.port.phase(phase, iteration, note).await
        }

        async fn tool(
            &mut self,
            step: &str,
            request: port::ToolRequest,
        ) -> Result<port::ToolResult, FlowError> {
            self.steps.push(step.to_owned());
            self.port.tool(step, request).await
        }

        async fn llm(
            &mut self,
            step: &str,
            request: zopu_llm::ChatRequest,
        ) -> Result<zopu_llm::ChatReply, FlowError> {
            self.port.llm(step, request).await
        }

        async fn guardrail(
            &mut self,
            step: &str,
            rule: &str,
            detail: &str,
            action: &str,
        ) -> Result<(), FlowError> {
            self.port.guardrail(step, rule, detail, action).await
        }

        fn guardrails(&self) -> u32 {
            self.port.guardrails()
        }
    }

    #[tokio::test]
    async fn exploration_takes_its_recorded_steps_in_order() {
        // Runs are recorded and replayed by step: these names and their
        // order are an event contract.
        let (_dir, port) = crate::port::direct(&[
            ("src/lib.rs", "fn main() {}\n"),
            ("src/quuxf.rs", "// quuxf stuff\nfn quuxf() {}\n"),
        ]);
        let mut port = Steps {
            port,
            steps: Vec::new(),
        };
        let input = ExploreInput {
            question: "How does the `quuxfrobnicator_zeta` work with blorptastic_wibble?".into(),
            ..Default::default()
        };
        let result = explore(&mut port, &input).await.unwrap();
        assert_eq!(
            port.steps,
            [
                "Plan 1",
                "Act 1",
                "explore:1:search:0",
                "explore:1:search:1",
                "explore:1:list",
                "explore:1:index",
                "Reflect 1",
                // Nothing matched: a second round with broader terms.
                "Act 2",
                "explore:2:search:0",
                "explore:2:search:1",
                "explore:2:search:2",
                "explore:2:search:3",
                "explore:2:list",
                "explore:2:index",
                "explore:2:read:0",
                "Reflect 2",
                "verify:0",
            ]
        );
        assert_eq!(result.keywords, ["quuxf", "zeta", "blorp", "wibbl"]);
        assert!(!result.findings[0].assumption, "{:?}", result.findings);
    }

    #[tokio::test]
    async fn the_evidence_starts_at_the_line_that_holds_the_question_s_words_together() {
        let mut mux = String::from("// The router.\nuse crate::middleware::Middleware;\n");
        for number in 0..30 {
            mux.push_str(&format!("fn handler_{number}() {{}}\n"));
        }
        mux.push_str("fn use_layer(&mut self) {\n    panic!(\"middlewares must be added before routes\");\n}\n");
        let (_dir, mut port) = crate::port::direct(&[
            ("src/mux.rs", &mux),
            ("src/chain.rs", "// A middleware chain.\nfn chain() {}\n"),
        ]);
        let input = ExploreInput {
            question: "Why do I get a panic when I add middleware after routes?".into(),
            provider: "offline".into(),
            repository_commit: "0123456789abcdef0123456789abcdef01234567".into(),
        };
        let result = explore(&mut port, &input).await.unwrap();
        let evidence = &result.findings[0].evidence[0];
        assert_eq!(evidence.path, "src/mux.rs", "{:?}", result.findings);
        assert_eq!(evidence.start_line, 34, "{evidence:?}");
        assert!(evidence.snippet.starts_with("panic!("), "{evidence:?}");
        assert_eq!(
            evidence.note,
            "holds several of the question's words together"
        );
        assert!(evidence.verified, "{evidence:?}");
    }

    #[tokio::test]
    async fn a_file_calling_what_the_leading_file_defines_follows_it() {
        let (_dir, mut port) = crate::port::direct(&[
            (
                "src/score.rs",
                "/// The frecency score of a directory.\npub fn frecency_score(rank: f64) -> f64 {\n    rank * 2.0\n}\n",
            ),
            (
                "src/stream.rs",
                "fn next(dir: &Dir) -> f64 {\n    frecency_score(dir.rank)\n}\n",
            ),
            (
                "src/report.rs",
                "// Prints each entry with its frecency score.\nfn print() {}\n",
            ),
        ]);
        let question = "How is the frecency score computed?";
        let gathered = gather(&mut port, "t", question, &keywords(question), 3)
            .await
            .unwrap();
        let paths: Vec<&str> = gathered.ranked.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths[..2],
            ["src/score.rs", "src/stream.rs"],
            "{:?}",
            gathered.ranked
        );
    }

    #[test]
    fn a_file_the_leading_file_imports_or_that_imports_it_moves_up() {
        let file = |path: &str, score: f64, linked: &[&str]| RankedFile {
            path: path.to_owned(),
            score,
            linked: linked.iter().map(|p| (*p).to_owned()).collect(),
            ..Default::default()
        };
        let mut ranked = vec![
            file("src/db/dir.rs", 1.0, &["src/db/mod.rs"]),
            file("src/cmd/query.rs", 0.5, &[]),
            file("src/import/atuin.rs", 0.48, &[]),
            file("src/db/mod.rs", 0.45, &[]),
            // It imports the leading file.
            file("src/db/stream.rs", 0.44, &["src/db/dir.rs"]),
            // A test importing it gains nothing unless tests are asked for.
            file("tests/db.rs", 0.43, &["src/db/dir.rs"]),
        ];
        let mut asking_for_tests = ranked.clone();
        follow_imports(&mut ranked, Asks::default());
        let order: Vec<&str> = ranked.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            order,
            [
                "src/db/dir.rs",
                "src/db/mod.rs",
                "src/db/stream.rs",
                "src/cmd/query.rs",
                "src/import/atuin.rs",
                "tests/db.rs"
            ]
        );
        // Asked which tests cover it, the test gains and the sources do not.
        follow_imports(&mut asking_for_tests, Asks::of(&["tests".to_owned()]));
        let order: Vec<&str> = asking_for_tests.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            order,
            [
                "src/db/dir.rs",
                "tests/db.rs",
                "src/cmd/query.rs",
                "src/import/atuin.rs",
                "src/db/mod.rs",
                "src/db/stream.rs"
            ]
        );
        // Links never lift a file above the leading one.
        let mut ranked = vec![file("a.rs", 1.0, &["b.rs"]), file("b.rs", 0.99, &["a.rs"])];
        follow_imports(&mut ranked, Asks::default());
        assert_eq!(ranked[0].path, "a.rs");
    }

    #[test]
    fn a_source_file_holding_a_quoted_phrase_keeps_a_place_however_the_index_ranks_it() {
        let searched = |path: &str, score: f64, keywords: &[&str]| RankedFile {
            path: path.to_owned(),
            score,
            keywords: keywords.iter().map(|k| (*k).to_owned()).collect(),
            ..Default::default()
        };
        let indexed = |path: &str, score: f64| FoundFile {
            path: path.to_owned(),
            score,
            matched: Vec::new(),
            definitions: Vec::new(),
            best_line: None,
            linked: Vec::new(),
        };
        let question_keywords = ["Did you mean".to_owned(), "option".to_owned()];
        let ranked_with = |phrase_in: &str| {
            let mut ranked = vec![
                searched("lib/command.js", 10.0, &["option"]),
                searched("lib/suggest.js", 4.0, &["option"]),
                searched("tests/suggest.test.js", 9.0, &["option"]),
            ];
            for file in &mut ranked {
                if file.path == phrase_in {
                    file.keywords.insert("Did you mean".to_owned());
                }
            }
            let index = [
                indexed("lib/command.js", 15.0),
                indexed("lib/option.js", 11.0),
                indexed("lib/help.js", 8.0),
                indexed("lib/suggest.js", 5.0),
            ];
            blend(&mut ranked, &index, Asks::of(&question_keywords));
            ranked.into_iter().map(|file| file.path).collect::<Vec<_>>()
        };
        // Without the phrase the index's second and third files lead it.
        assert_eq!(ranked_with("")[3], "lib/suggest.js");
        // With it the source that holds the message ranks second.
        assert_eq!(
            ranked_with("lib/suggest.js")[..2],
            ["lib/command.js", "lib/suggest.js"]
        );
        // A test that holds it gains nothing: the question asks about behaviour.
        let ranked = ranked_with("tests/suggest.test.js");
        assert!(
            ranked
                .iter()
                .position(|path| path == "tests/suggest.test.js")
                > ranked.iter().position(|path| path == "lib/help.js"),
            "{ranked:?}"
        );
    }

    #[test]
    fn a_plural_in_ies_is_searched_in_the_forms_code_spells() {
        // "cookies" stems to `cooky`, which no code holds.
        assert_eq!(keywords("How are cookies signed?")[0], "cooky");
        assert_eq!(search_pattern("cooky"), ("cooky|cookie".to_owned(), false));
        assert_eq!(search_pattern("entry"), ("entry|entrie".to_owned(), false));
        // A vowel before the `y`, or an abbreviation, as before.
        assert_eq!(search_pattern("key"), ("key".to_owned(), true));
        assert_eq!(search_pattern("proxy").0, "proxy|proxie");
        assert_eq!(
            search_pattern("directory"),
            ("directory|dir|directorie".to_owned(), false)
        );
    }

    #[test]
    fn keywords_keep_quoted_identifiers_and_drop_generic_words() {
        let words = keywords("Explore how `parse_config` handles the auth session tokens");
        assert_eq!(words[0], "parse_config");
        assert!(
            !words.iter().any(|w| w == "explore" || w == "how"),
            "{words:?}"
        );
        assert!(words.len() >= 3, "{words:?}");
        // A quoted message is searched as written, up to its ellipsis.
        let words = keywords("How does it come up with the \"Did you mean ...?\" hint?");
        assert_eq!(words[0], "Did you mean", "{words:?}");
        let words = keywords("Why does it print “Unknown option:” twice?");
        assert_eq!(words[0], "Unknown option", "{words:?}");
        // A message is words: a quoted JSON object's keys and values are not
        // messages; an ellipsis first keeps what follows it; a quote inside
        // backticks pairs with nothing.
        let words =
            keywords("Why does `{\"main\": \"index.js\"}` fail with \"... is not a function\"?");
        assert_eq!(words[0], "{\"main\": \"index.js\"}", "{words:?}");
        assert_eq!(words[1], "is not a function", "{words:?}");
        let words = keywords("Why is `a\"b` fine but \"cannot read config\" shown?");
        assert!(
            words.contains(&"cannot read config".to_owned()),
            "{words:?}"
        );
        let words = keywords(
            "Set \"name\": \"demo\", \"type\": \"module\", \"main\": \"index.js\" in the manifest",
        );
        assert!(!words.contains(&"index.js".to_owned()), "{words:?}");
        assert_eq!(whole_word("frecency_score"), r"\bfrecency_score\b");
        assert_eq!(whole_word("$emit"), r"\$emit\b");
        // An unclosed quote quotes nothing.
        let words = keywords("Why is the 5\" display layout cut off?");
        assert!(!words.iter().any(|word| word.contains(' ')), "{words:?}");
        // A phrase code calls by a name of its own is searched by that name,
        // unless it only says where a value is given.
        let words = keywords("Where are options restricted to a set of allowed values tested?");
        assert_eq!(words[0], "choices", "{words:?}");
        let words = keywords("Why is a script starting with `#!` made executable?");
        assert_eq!(words[0], "shebang", "{words:?}");
        let words = keywords("What if the entry files I pass on the command line match nothing?");
        assert!(!words.contains(&"cli".to_owned()), "{words:?}");
    }

    #[test]
    fn the_defining_source_outranks_tests_and_docs_that_mention_it() {
        let keywords = vec!["publisher".to_owned(), "fork".to_owned()];
        let hit = |k: &str, path: &str, line: u64, text: &str| {
            (k.to_owned(), line, format!("{path}\u{0}{text}"))
        };
        let mut hits = vec![
            hit("publisher", "src/publish.rs", 10, "pub struct Publisher {"),
            hit("fork", "src/publish.rs", 40, "// never fork the chain"),
        ];
        for line in 1..30 {
            hits.push(hit(
                "publisher",
                "tests/it/foundation.rs",
                line,
                "let p = publisher();",
            ));
            hits.push(hit(
                "fork",
                "tests/it/foundation.rs",
                100 + line,
                "assert no fork",
            ));
        }
        hits.push(hit("publisher", "CHANGELOG.md", 3, "Publisher never forks"));
        hits.push(hit("fork", "CHANGELOG.md", 4, "fork"));
        let sizes = BTreeMap::from([
            ("src/publish.rs".to_owned(), 40_000),
            ("tests/it/foundation.rs".to_owned(), 40_000),
            ("CHANGELOG.md".to_owned(), 2_000),
        ]);
        let ranked = rank(&keywords, &hits, &sizes, &[]);
        assert_eq!(ranked[0].path, "src/publish.rs", "{ranked:?}");
        // Asked about the tests, the tests come first.
        let keywords = vec![
            "publisher".to_owned(),
            "fork".to_owned(),
            "tests".to_owned(),
        ];
        let ranked = rank(&keywords, &hits, &sizes, &[]);
        assert_eq!(ranked[0].path, "tests/it/foundation.rs");
    }

    #[test]
    fn test_modules_are_told_by_their_names_in_every_language() {
        for path in [
            "src/export/tests.rs",
            "url_test.go",
            "tests/test_core.py",
            "src/main/java/com/x/RingBufferTest.java",
            "lib/parser-tests.js",
            "test/dts.test.ts",
        ] {
            assert_eq!(role_of(path), FileRole::Tests, "{path}");
        }
        for path in [
            "src/latest.rs",
            "contest.go",
            "src/click/testing.py",
            "TestKit/Main.java",
        ] {
            assert_eq!(role_of(path), FileRole::Source, "{path}");
        }
        for path in [
            "src/docs/asciidoc/en/guide.adoc",
            "docs/api/index.html",
            "src/doc/x.rs",
            "LICENSE",
            "COPYING",
            "pkg/AUTHORS",
        ] {
            assert_eq!(role_of(path), FileRole::Docs, "{path}");
        }
        // Benchmarks exercise the source but are not the tests asked for;
        // build and install files are not what the program does.
        for path in [
            "src/jmh/java/com/x/RingBufferBenchmark.java",
            "benches/parse.rs",
            "build.rs",
            "install.sh",
            "tools/get.ps1",
            "Makefile",
            "justfile",
            "docker/Dockerfile",
        ] {
            assert_eq!(role_of(path), FileRole::Auxiliary, "{path}");
        }
    }

    #[test]
    fn asked_which_tests_cover_something_a_test_outranks_the_source_and_a_testing_helper_stays() {
        let hit = |k: &str, path: &str, line: u64, text: &str| {
            (k.to_owned(), line, format!("{path}\u{0}{text}"))
        };
        let hits = vec![
            hit(
                "cookie",
                "lib/response.js",
                10,
                "res.cookie = function cookie(name) {",
            ),
            hit("signed", "lib/response.js", 12, "if (signed) {"),
            hit(
                "cookie",
                "test/res.cookie.js",
                5,
                "res.cookie('name', 'tobi')",
            ),
            hit("signed", "test/res.cookie.js", 30, "describe('signed')"),
            hit("cookie", "lib/testing.js", 3, "function cookieJar() {"),
        ];
        let sizes = BTreeMap::from([
            ("lib/response.js".to_owned(), 20_000),
            ("test/res.cookie.js".to_owned(), 8_000),
            ("lib/testing.js".to_owned(), 2_000),
        ]);
        let keywords = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        let paths: Vec<String> = sizes.keys().cloned().collect();
        let ranked = rank(&keywords(&["cookie", "signed"]), &hits, &sizes, &paths);
        assert_eq!(ranked[0].path, "lib/response.js", "{ranked:?}");
        let ranked = rank(
            &keywords(&["test", "cookie", "signed"]),
            &hits,
            &sizes,
            &paths,
        );
        assert_eq!(ranked[0].path, "test/res.cookie.js", "{ranked:?}");
        let helper = ranked.iter().position(|file| file.path == "lib/testing.js");
        let source = ranked
            .iter()
            .position(|file| file.path == "lib/response.js");
        assert!(helper < source, "{ranked:?}");
    }

    #[test]
    fn the_file_holding_a_quoted_message_outranks_one_with_more_of_the_other_words() {
        let keywords: Vec<String> = ["Did you mean", "mistyp", "option", "command"]
            .map(str::to_owned)
            .to_vec();
        let hit = |k: &str, path: &str, line: u64| (k.to_owned(), line, format!("{path}\u{0}text"));
        let mut hits = vec![hit("Did you mean", "lib/suggest.js", 9)];
        for line in 1..=4 {
            hits.push(hit("option", "lib/command.js", line));
            hits.push(hit("command", "lib/command.js", line + 10));
        }
        let sizes = BTreeMap::from([
            ("lib/suggest.js".to_owned(), 2_000),
            ("lib/command.js".to_owned(), 2_000),
        ]);
        let ranked = rank(&keywords, &hits, &sizes, &[]);
        assert_eq!(ranked[0].path, "lib/suggest.js", "{ranked:?}");
    }

    #[test]
    fn ranking_prefers_coverage_density_and_paths() {
        let keywords = vec!["auth".to_owned(), "session".to_owned()];
        let hit = |k: &str, path: &str, line: u64| (k.to_owned(), line, format!("{path}\u{0}text"));
        let hits = vec![
            hit("auth", "src/auth.rs", 1),
            hit("session", "src/auth.rs", 2),
            hit("auth", "README.md", 1),
            hit("auth", "Cargo.lock", 3),
        ];
        let sizes = BTreeMap::from([
            ("src/auth.rs".to_owned(), 400),
            ("README.md".to_owned(), 400),
            ("Cargo.lock".to_owned(), 40_000),
        ]);
        let ranked = rank(
            &keywords,
            &hits,
            &sizes,
            &["src/session/store.rs".to_owned()],
        );
        assert_eq!(ranked[0].path, "src/auth.rs");
        assert_eq!(ranked.last().map(|f| f.path.as_str()), Some("Cargo.lock"));
        assert!(
            ranked
                .iter()
                .any(|f| f.path == "src/session/store.rs" && f.path_hits == 1)
        );
    }
}
