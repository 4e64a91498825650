//! Exploration (main spec section 30) with the offline provider: frame the
//! question as keywords, search, rank files by match density and path
//! relevance, read the top hits, verify the evidence, and say honestly what
//! is heuristic and what is unknown. [`gather`] is shared with the issue flow.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;
use zopu_core::keywords::code_forms;
use zopu_core::text::clip_chars;

use regex::Regex;
use zopu_sandbox::tools::{FindCodeInput, FoundFile, ListFilesInput, ReadFileInput, SearchInput};
use zopu_schema::pb::FlowPhase;

use crate::grounding;
use crate::port::{self, FlowError, Port};
use crate::results::{
    EvidenceItem, ExplorationResult, Finding, MapEdge, MapNode, Provenance, ResultVersion,
    SystemMap,
};

/// Most keywords searched.
const KEYWORDS_MAX: usize = 6;
/// Matches asked for per keyword.
const MATCHES_PER_KEYWORD: usize = 300;
/// Matches kept per file and keyword: a keyword that many files mention
/// still reaches them all before the cap.
const MATCHES_PER_FILE: usize = 12;
/// Files read and reported.
const TOP_FILES: usize = 5;
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

/// What a file is, for ranking: what answers a behaviour question is
/// source; tests, docs and changelogs mention it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileRole {
    Lock,
    Changelog,
    Docs,
    Tests,
    /// Examples, samples and demos of using the project.
    Examples,
    /// Data and configuration (JSON, YAML, XML, TOML), generated shell
    /// completions, manual pages, TypeScript declaration files, test
    /// snapshots, Nix expressions, helper scripts (`scripts/`), build and
    /// install files (`Makefile`, `build.rs`, `install.sh`: they build or
    /// install the program, they are not what it does), benchmarks and
    /// stress tests (they exercise the source, and are not the tests a
    /// question asks for).
    Auxiliary,
    Source,
}

/// Files about the project rather than of it, often without an extension:
/// read as docs.
const PROJECT_NOTICES: &[&str] = &[
    "license",
    "licence",
    "copying",
    "notice",
    "authors",
    "contributors",
    "codeowners",
    "patents",
    "maintainers",
];

/// The role of the file at `path` (repository-relative), from its path only.
pub fn role_of(path: &str) -> FileRole {
    let lower = path.to_lowercase();
    let name = lower.rsplit('/').next().unwrap_or(&lower);
    // The name before its extensions, as written (`RingBufferTest`).
    let stem = path
        .rsplit('/')
        .next()
        .and_then(|name| name.split('.').next())
        .unwrap_or_default();
    if lower.ends_with(".lock")
        || lower.ends_with("-lock.json")
        || lower.ends_with("lock.yaml")
        || lower.contains(".min.")
    {
        FileRole::Lock
    } else if ["changelog", "changes", "history", "news", "releases"]
        .iter()
        .any(|stem| name.starts_with(stem))
    {
        FileRole::Changelog
    } else if [".md", ".txt", ".rst", ".adoc", ".asciidoc"]
        .iter()
        .any(|extension| lower.ends_with(extension))
        || PROJECT_NOTICES.contains(&stem.to_lowercase().as_str())
        || lower
            .split('/')
            .rev()
            .skip(1)
            .any(|c| matches!(c, "docs" | "doc"))
    {
        FileRole::Docs
    } else if lower.split('/').rev().skip(1).any(|c| {
        matches!(
            c,
            "test" | "tests" | "spec" | "__tests__" | "fixtures" | "it"
        )
    }) || name.starts_with("test_")
        || is_test_stem(stem)
        || name.contains(".test.")
        || name.contains(".spec.")
    {
        FileRole::Tests
    } else if lower.split('/').rev().skip(1).any(|c| {
        matches!(
            c,
            "examples" | "example" | "_examples" | "samples" | "sample" | "demo" | "demos"
        )
    }) {
        FileRole::Examples
    } else if [".json", ".yaml", ".yml", ".xml", ".toml", ".ini", ".cfg"]
        .iter()
        .any(|extension| lower.ends_with(extension))
        || lower.split('/').rev().skip(1).any(|c| {
            matches!(
                c,
                "bench" | "benches" | "benchmarks" | "jmh" | "perftest" | "jcstress"
            )
        })
        || lower
            .split('/')
            .any(|c| matches!(c, "man" | "completions" | "scripts"))
        || lower.ends_with(".nix")
        || is_build_or_install(name)
        || lower.ends_with(".d.ts")
        || lower.ends_with(".snap")
        || name
            .rsplit_once('.')
            .is_some_and(|(_, extension)| matches!(extension, "1" | "5" | "7" | "8"))
    {
        FileRole::Auxiliary
    } else {
        FileRole::Source
    }
}

/// Files that build or install a program, by their lowercase name: a
/// build script or recipe, or an install script (`install.sh`,
/// `get.ps1`). A script of another name is left to its directory.
fn is_build_or_install(name: &str) -> bool {
    const BUILD_FILES: &[&str] = &[
        "makefile",
        "gnumakefile",
        "justfile",
        "dockerfile",
        "containerfile",
        "build.rs",
        "rakefile",
        "gulpfile.js",
        "gruntfile.js",
    ];
    const INSTALL_STEMS: &[&str] = &["install", "uninstall", "bootstrap", "get"];
    const SCRIPT_EXTENSIONS: &[&str] = &["sh", "ps1", "bat", "cmd"];
    BUILD_FILES.contains(&name)
        || name.split_once('.').is_some_and(|(stem, extension)| {
            INSTALL_STEMS.contains(&stem) && SCRIPT_EXTENSIONS.contains(&extension)
        })
}

/// A file stem that names a test module: `tests`, `url_test`, `parser-tests`,
/// `RingBufferTest` (not `latest` or `contest`).
fn is_test_stem(stem: &str) -> bool {
    let lower = stem.to_lowercase();
    matches!(lower.as_str(), "test" | "tests")
        || ["_test", "_tests", "-test", "-tests"]
            .iter()
            .any(|suffix| lower.ends_with(suffix))
        || ["Test", "Tests"].iter().any(|suffix| {
            stem.strip_suffix(suffix)
                .is_some_and(|before| before.ends_with(|c: char| c.is_ascii_alphanumeric()))
        })
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

/// Files the code index ranks for a question.
const INDEX_FILES: usize = 50;
/// Longest question passed to the code index.
const INDEX_QUERY_CHARS: usize = 1_000;
/// How much of a file's final score is the code index's ranking (the rest
/// is the keyword search's); each is scaled to its best file first.
/// (`zopu eval`, dev half: 0.7 gave top-1 0.69 and recall@3 0.74, against
/// 0.72 and 0.67 for the search alone and 0.65 and 0.73 for the index alone.)
const INDEX_SHARE: f64 = 0.7;

/// Phrases and signs code calls by a name of their own: a question says
/// "command line" where the code says `cli`, shows `#!` where it says
/// `shebang`, and asks for "allowed values" where a command-line library
/// says `choices` (click, argparse, commander, yargs). Each name is searched
/// and given to the code index beside the question's own words.
const NAMED_PHRASES: &[(&str, &str)] = &[
    ("command line", "cli"),
    ("command-line", "cli"),
    ("#!", "shebang"),
    ("allowed values", "choices"),
];

/// Where a question says something is given, not what it is about: a value
/// passed "on the command line" is read by the code the question asks
/// about, seldom by the command-line module itself.
const SETTING_PHRASES: &[&str] = &["on the command line", "on the command-line"];

/// What the code index is asked: the question, then (when it differs) the
/// question again with its words in the short forms code writes them in
/// ("data dir" for "data directory", so the index sees the pair side by
/// side as in `data_dir`), and the names of [`NAMED_PHRASES`] it holds.
/// The names of the [`NAMED_PHRASES`] a question holds, leaving out
/// [`SETTING_PHRASES`].
fn named_in(question: &str) -> Vec<&'static str> {
    let lower = SETTING_PHRASES
        .iter()
        .fold(question.to_lowercase(), |text, phrase| {
            text.replace(phrase, " ")
        });
    let mut names: Vec<&'static str> = Vec::new();
    for (phrase, name) in NAMED_PHRASES {
        if lower.contains(phrase) && !names.contains(name) {
            names.push(name);
        }
    }
    names
}

fn index_query(question: &str) -> String {
    let mut query = clip_chars(question, INDEX_QUERY_CHARS);
    for name in named_in(question) {
        query.push(' ');
        query.push_str(name);
    }
    let mut shortened = false;
    let short: Vec<String> = zopu_core::keywords::tokens(&query)
        .into_iter()
        .map(
            |(token, stem)| match stem.and_then(|stem| code_forms(&stem).into_iter().nth(1)) {
                Some(short) => {
                    shortened = true;
                    short
                }
                None => token.to_owned(),
            },
        )
        .collect();
    if shortened {
        query.push(' ');
        query.push_str(&short.join(" "));
    }
    query
}

/// Folds the code index's ranking into the keyword search's: each score
/// scaled to its best file, the index's weighed by the square of the
/// file's role weight (the index scores prose, where a question's own words
/// abound, as readily as code), mixed by [`INDEX_SHARE`]. Files only the index found join
/// with what it says they define.
fn blend(ranked: &mut Vec<RankedFile>, indexed: &[FoundFile], asks: Asks) {
    let best_search = ranked.iter().map(|f| f.score).fold(0.0, f64::max);
    let weighed: Vec<(&FoundFile, f64)> = indexed
        .iter()
        .map(|found| (found, found.score * weight_of(&found.path, asks).powi(2)))
        .collect();
    let best_index = weighed.iter().map(|(_, score)| *score).fold(0.0, f64::max);
    let share = INDEX_SHARE;
    for file in ranked.iter_mut() {
        file.score = if best_search > 0.0 {
            (1.0 - share) * file.score / best_search
        } else {
            0.0
        };
    }
    for (found, score) in weighed {
        let index_part = if best_index > 0.0 {
            share * score / best_index
        } else {
            0.0
        };
        let defines = found
            .definitions
            .iter()
            .map(|d| (d.line, d.name.clone()))
            .collect();
        match ranked.iter_mut().find(|f| f.path == found.path) {
            Some(file) => {
                file.score += index_part;
                file.index_score = found.score;
                file.defines = defines;
                file.best_line = found.best_line;
                file.linked = found.linked.iter().cloned().collect();
            }
            None => ranked.push(RankedFile {
                path: found.path.clone(),
                score: index_part,
                index_score: found.score,
                defines,
                best_line: found.best_line,
                linked: found.linked.iter().cloned().collect(),
                ..Default::default()
            }),
        }
    }
    // A phrase the question quotes is a message or a line the user saw:
    // the source that holds it verbatim is where the answer starts, though
    // the index (which sees words, not phrases) may rank it low.
    for file in ranked.iter_mut() {
        if file
            .keywords
            .iter()
            .any(|keyword| is_quoted_phrase(keyword))
            && weight_of(&file.path, asks) >= 1.0
        {
            file.score += QUOTED_PHRASE_SHARE;
        }
    }
    sort_ranked(ranked);
}

/// What a file of full weight for the question (source, or what it asks
/// for) gains when it holds a phrase the question quotes: the keyword
/// search's share again. (`zopu eval`: commander's "Did you mean ...?"
/// question found `suggestSimilar.js`, dev recall@3 0.82 → 0.83; nothing
/// else moved.)
const QUOTED_PHRASE_SHARE: f64 = 1.0 - INDEX_SHARE;

/// What a file linked by name to the leading file gains, as a share of the
/// leading file's score. (`zopu eval`, dev half, recall@3: 0.81 without,
/// 0.82 at 0.05 and 0.1, 0.81 at 0.15, 0.79 at 0.25; the holdout half went
/// 0.72 → 0.77 at 0.1.)
const LINK_WEIGHT: f64 = 0.1;
/// The leading file's definitions whose users are searched.
const LINKED_NAMES: usize = 3;
/// The files after the leading one checked for a definition it uses.
const LINK_CANDIDATES: usize = 10;
/// Shorter names link too much to be telling.
const LINK_NAME_MIN_CHARS: usize = 4;

/// A search pattern for `name` as a whole word: `\b` on each side that
/// ends in a word character (`$emit` has none before its `$`).
fn whole_word(name: &str) -> String {
    let boundary = |c: Option<char>| {
        if c.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            r"\b"
        } else {
            ""
        }
    };
    format!(
        "{}{}{}",
        boundary(name.chars().next()),
        regex::escape(name),
        boundary(name.chars().last())
    )
}

/// The answer to a question is seldom one file: the function the leading
/// file defines is called from another, or it calls one defined elsewhere.
/// A source file that uses one of the names the leading file defines (of
/// the question's words), and a file among the next [`LINK_CANDIDATES`]
/// that defines such a name the leading file uses, gain [`LINK_WEIGHT`] of
/// the leading file's score; the leading file stays first.
async fn follow_links<P: Port>(
    port: &mut P,
    step: &str,
    ranked: &mut [RankedFile],
) -> Result<(), FlowError> {
    let Some((top, rest)) = ranked.split_first_mut() else {
        return Ok(());
    };
    if rest.is_empty() {
        return Ok(());
    }
    let mut linked: BTreeSet<String> = BTreeSet::new();
    let names = top
        .defines
        .iter()
        .map(|(_, name)| name)
        .filter(|name| name.chars().count() >= LINK_NAME_MIN_CHARS)
        .take(LINKED_NAMES);
    for (index, name) in names.enumerate() {
        let input = SearchInput {
            pattern: whole_word(name),
            literal: false,
            case_insensitive: false,
            path: String::new(),
            max_matches: Some(MATCHES_PER_KEYWORD),
            max_matches_per_file: Some(1),
        };
        if let Ok(users) = port::search(port, &format!("{step}:users:{index}"), input).await? {
            linked.extend(
                users
                    .matches
                    .into_iter()
                    .filter(|user| user.path != top.path && role_of(&user.path) == FileRole::Source)
                    .map(|user| user.path),
            );
        }
    }
    let read = ReadFileInput {
        path: top.path.clone(),
        ..Default::default()
    };
    if let Ok(read) = port::read_file(port, &format!("{step}:uses"), read).await? {
        for file in rest.iter().take(LINK_CANDIDATES) {
            let uses = file.defines.iter().any(|(_, name)| {
                name.chars().count() >= LINK_NAME_MIN_CHARS
                    && regex::Regex::new(&whole_word(name))
                        .is_ok_and(|re| re.is_match(&read.content))
            });
            if uses {
                linked.insert(file.path.clone());
            }
        }
    }
    for file in rest.iter_mut() {
        if linked.contains(&file.path) {
            file.score += LINK_WEIGHT * top.score;
        }
    }
    sort_ranked(rest);
    Ok(())
}

/// What a file the leading file imports, or that imports it, gains as a
/// share of the leading file's score, among the [`LINK_CANDIDATES`] after
/// it. (`zopu eval`, recall@3: dev 0.843 → 0.849 and holdout 0.796 →
/// 0.802 at 0.1; 0.05 gained nothing; 0.15 and 0.2 lost more than they
/// gained; without the name links of [`follow_links`] the holdout half fell
/// to 0.765, so both stay.)
const IMPORT_LINK_WEIGHT: f64 = 0.1;

/// The code index knows which of its results import each other: a file
/// the leading one imports (its helper module, the submodule it declares)
/// or that imports it gains [`IMPORT_LINK_WEIGHT`] of the leading file's
/// score, if it is of full weight for the question (a test linked to the
/// source it tests gains only when the question asks for tests); the
/// leading file stays first.
fn follow_imports(ranked: &mut [RankedFile], asks: Asks) {
    let Some((top, rest)) = ranked.split_first_mut() else {
        return;
    };
    for file in rest.iter_mut().take(LINK_CANDIDATES) {
        // A test linked to the source it tests is no answer to a question
        // about behaviour: only files of full weight for the question gain.
        if weight_of(&file.path, asks) < 1.0 {
            continue;
        }
        if top.linked.contains(&file.path) || file.linked.contains(&top.path) {
            file.score += IMPORT_LINK_WEIGHT * top.score;
        }
    }
    sort_ranked(rest);
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

/// Findings with evidence for the top files of a search round.
pub fn findings(gathered: &Gathered, top: usize) -> Vec<Finding> {
    let mut out = Vec::new();
    for file in gathered.ranked.iter().take(top) {
        let keywords: Vec<String> = file.keywords.iter().cloned().collect();
        let defs = gathered
            .windows
            .get(&file.path)
            .map(|w| definitions(w, &gathered.keywords))
            .unwrap_or_default();
        let together = file.best_line.and_then(|line| {
            let (start, content) = gathered.windows.get(&file.path)?;
            let text = content
                .lines()
                .nth(usize::try_from(line.checked_sub(*start)?).ok()?)?;
            Some(EvidenceItem {
                path: file.path.clone(),
                start_line: line as u32,
                end_line: line as u32,
                snippet: clip_chars(text.trim(), 200),
                note: "holds several of the question's words together".to_owned(),
                verified: false,
            })
        });
        let mut evidence: Vec<EvidenceItem> = together
            .into_iter()
            .chain(
                defs.iter()
                    .filter(|(line, _, _)| Some(*line) != file.best_line)
                    .map(|(line, name, text)| EvidenceItem {
                        path: file.path.clone(),
                        start_line: *line as u32,
                        end_line: *line as u32,
                        snippet: text.clone(),
                        note: format!("defines `{name}`"),
                        verified: false,
                    }),
            )
            .collect();
        for (line, text, keyword) in &file.matches {
            if evidence.len() >= 3 {
                break;
            }
            if evidence.iter().any(|e| u64::from(e.start_line) == *line) {
                continue;
            }
            evidence.push(EvidenceItem {
                path: file.path.clone(),
                start_line: *line as u32,
                end_line: *line as u32,
                snippet: clip_chars(text.trim(), 200),
                note: format!("mentions `{keyword}`"),
                verified: false,
            });
        }
        let subject = if keywords.is_empty() {
            "the question's terms (in its path)".to_owned()
        } else {
            keywords
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let claim = if defs.is_empty() {
            format!(
                "`{}` refers to {subject} on {} line(s)",
                file.path,
                file.matches.len()
            )
        } else {
            let names: Vec<String> = defs
                .iter()
                .map(|(_, name, _)| format!("`{name}`"))
                .collect();
            format!(
                "`{}` defines {} related to {subject}",
                file.path,
                names.join(", ")
            )
        };
        let detail = format!(
            "Ranked by keyword search and the code index (score {:.2}: {} keyword(s), {} matching line(s), index score {:.1}{}{}).",
            file.score,
            file.keywords.len(),
            file.matches.len(),
            file.index_score,
            if file.defines.is_empty() {
                String::new()
            } else {
                let names: Vec<String> = file
                    .defines
                    .iter()
                    .map(|(_, name)| format!("`{name}`"))
                    .collect();
                format!(", defines {}", names.join(", "))
            },
            if file.path_hits > 0 {
                ", path matches the question"
            } else {
                ""
            }
        );
        out.push(Finding {
            claim,
            detail,
            evidence,
            assumption: false,
        });
    }
    out
}

fn stem_of(path: &str) -> Option<String> {
    let name = path.rsplit('/').next()?;
    let stem = name.split('.').next()?.to_lowercase();
    (stem.len() >= 3
        && !matches!(
            stem.as_str(),
            "index" | "main" | "mod" | "lib" | "__init__" | "init" | "app" | "utils"
        ))
    .then_some(stem)
}

/// A small map: the question, the top files, and which file names another.
pub fn system_map(question: &str, gathered: &Gathered, top: usize) -> SystemMap {
    let mut map = SystemMap::default();
    map.nodes.push(MapNode {
        id: "question".into(),
        label: clip_chars(question, 100),
        detail: "the question explored".into(),
    });
    let files: Vec<&RankedFile> = gathered.ranked.iter().take(top).collect();
    for (index, file) in files.iter().enumerate() {
        map.nodes.push(MapNode {
            id: format!("f{index}"),
            label: clip_chars(&file.path, 110),
            detail: format!("{} matching line(s)", file.matches.len()),
        });
    }
    for (a, from) in files.iter().enumerate() {
        let Some((_, content)) = gathered.windows.get(&from.path) else {
            continue;
        };
        let content = content.to_lowercase();
        for (b, to) in files.iter().enumerate() {
            if a != b
                && let Some(stem) = stem_of(&to.path)
                && content.contains(&stem)
            {
                map.edges.push(MapEdge {
                    from: format!("f{a}"),
                    to: format!("f{b}"),
                    label: "names".into(),
                });
            }
        }
    }
    for (index, file) in files.iter().enumerate() {
        let label = file
            .keywords
            .iter()
            .next()
            .map_or_else(|| "path".to_owned(), |k| format!("matches {k}"));
        map.edges.push(MapEdge {
            from: "question".into(),
            to: format!("f{index}"),
            label: clip_chars(&label, 100),
        });
    }
    map
}

/// What exploration starts from.
#[derive(Debug, Clone, Default)]
pub struct ExploreInput {
    pub question: String,
    pub provider: String,
    pub repository_commit: String,
}

/// Offline exploration through `port`.
pub async fn explore<P: Port>(
    port: &mut P,
    input: &ExploreInput,
) -> Result<ExplorationResult, FlowError> {
    port.phase(FlowPhase::Plan, 1, "Framing the question")
        .await?;
    let mut terms = keywords(&input.question);
    let mut iteration = 1;
    let mut gathered;
    loop {
        port.phase(FlowPhase::Act, iteration, "Searching the repository")
            .await?;
        gathered = gather(
            port,
            &format!("explore:{iteration}"),
            &input.question,
            &terms,
            TOP_FILES,
        )
        .await?;
        port.phase(FlowPhase::Reflect, iteration, "Checking the matches")
            .await?;
        if !gathered.ranked.is_empty() || iteration >= 2 {
            break;
        }
        // Nothing matched: one broader round with shorter stems.
        let broader: Vec<String> = terms
            .iter()
            .flat_map(|t| {
                t.split(['_', '-', '.', '/'])
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|t| t.len() >= 4)
            .map(|t| t.chars().take(5).collect::<String>())
            .collect();
        if broader.is_empty() || broader == terms {
            break;
        }
        terms = broader;
        iteration += 1;
    }
    let mut found = findings(&gathered, TOP_FILES);
    // Verify every evidence item against the workspace.
    let mut all = Vec::new();
    for (index, finding) in found.iter_mut().enumerate() {
        for mut item in std::mem::take(&mut finding.evidence) {
            item.note = format!("{index}\u{0}{}", item.note);
            all.push(item);
        }
    }
    let grounded = grounding::verify(port, "verify", all).await?;
    for mut item in grounded.kept {
        let (index, note) = item
            .note
            .split_once('\u{0}')
            .map(|(i, n)| (i.parse::<usize>().unwrap_or(0), n.to_owned()))
            .unwrap_or((0, item.note.clone()));
        item.note = note;
        if let Some(finding) = found.get_mut(index) {
            finding.evidence.push(item);
        }
    }
    for finding in &mut found {
        finding.assumption = !finding.evidence.iter().any(|e| e.verified);
    }
    let mut risks = vec!["Heuristic result: files were located by keyword search and ranking, not by running or fully reading the code; confirm before acting on it.".to_owned()];
    for keyword in &gathered.capped {
        risks.push(format!(
            "The search for `{keyword}` hit its match cap; less obvious places may be missing."
        ));
    }
    for (path, (first, content)) in &gathered.windows {
        for (offset, line) in content.lines().enumerate() {
            if (line.contains("TODO") || line.contains("FIXME") || line.contains("HACK"))
                && risks.len() < 6
            {
                risks.push(format!(
                    "`{path}` line {} has an open note near the matches: {}",
                    first + offset as u64,
                    clip_chars(line.trim(), 160)
                ));
            }
        }
    }
    let mut unknowns: Vec<String> = gathered
        .unmatched
        .iter()
        .map(|k| format!("Nothing in the repository mentions `{k}`."))
        .collect();
    unknowns.push("Runtime behaviour was not observed: no code was run.".to_owned());
    let mut next_actions: Vec<String> = found
        .iter()
        .filter_map(|f| f.evidence.iter().find(|e| e.verified))
        .take(3)
        .map(|e| format!("Read `{}` around line {}.", e.path, e.start_line))
        .collect();
    next_actions.push("Ask for an issue to turn a finding into a scoped change.".to_owned());
    let strongest: Vec<String> = gathered
        .ranked
        .iter()
        .take(3)
        .map(|f| format!("`{}`", f.path))
        .collect();
    let summary = if gathered.ranked.is_empty() {
        format!(
            "No file in the repository matches {}; the question may use different words than the code.",
            terms
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!(
            "Searched for {}: {} file(s) match; the strongest are {}. {}",
            terms
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", "),
            gathered.ranked.len(),
            strongest.join(", "),
            found.first().map(|f| f.claim.clone()).unwrap_or_default()
        )
    };
    Ok(ExplorationResult {
        version: ResultVersion::CURRENT,
        question: input.question.clone(),
        summary,
        system_map: system_map(&input.question, &gathered, TOP_FILES),
        findings: found,
        risks,
        unknowns,
        next_actions,
        keywords: terms,
        provenance: Provenance {
            provider: input.provider.clone(),
            heuristic: true,
            repository_commit: input.repository_commit.clone(),
            ..Default::default()
        },
    })
}

#[cfg(test)]
mod tests {
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
