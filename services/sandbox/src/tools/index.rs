//! `find_code`: a ranked lookup over a per-workspace code index.
//!
//! The index is built once per state of the checked-out tree (a fingerprint
//! of every indexed file's path, size and modification time, so once per
//! commit in practice) and kept in a small process-wide cache: every later
//! question about the same commit reuses it. For each text file it holds
//! the words of its identifiers and comments (`parseConfig`,
//! `parse_config` and "parse the config" all give `pars` and `config`:
//! identifiers are split at case and underscore boundaries and every word is
//! stemmed with the Snowball English stemmer), the words of its path, and
//! the names it defines (functions, methods, types, traits, classes,
//! constants, found by per-language line patterns).
//!
//! A query's words go through the same splitting and stemming, and files
//! score by BM25 over their words, plus a bonus per query word they define
//! and per query word in their path (more in the file's own name), per pair
//! of the query's adjacent words a name holds side by side, and for the one
//! line that holds three or more of the query's words (the leading files
//! are read again for it). Rare
//! words weigh most (inverse document frequency), so a long question's
//! telling word is never crowded out by common ones. Files are visited
//! through the same policy as `search` (no symlinks, no hard links, no
//! secret-bearing files, nothing over `max_file_bytes`, no binary).

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io::Read;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};

use regex::Regex;
use rust_stemmers::{Algorithm, Stemmer};
use serde::{Deserialize, Serialize};

mod links;

use super::files::{repo_dir, repo_relative, walker};
use super::{Error, ToolOutput};
use crate::policy::{Expect, RelPath, SandboxLimits, WorkspaceRoot, open_beneath};

/// Most files one index holds; a larger tree is indexed in path order up
/// to this many, and the output says so.
const MAX_INDEXED_FILES: usize = 20_000;
/// Most files a query returns.
const MAX_FILES: usize = 50;
/// Files returned when the query does not say.
const DEFAULT_FILES: usize = 10;
/// Most query words used (after splitting); more is not a code question.
const MAX_QUERY_WORDS: usize = 64;
/// Longest query, in bytes.
const MAX_QUERY_BYTES: usize = 2_000;
/// Indexes kept in the process-wide cache (one per workspace commit).
const CACHED_INDEXES: usize = 4;
/// Definitions reported per file.
const DEFINITIONS_PER_FILE: usize = 5;

/// BM25's term-frequency saturation and length normalisation.
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;
/// Added per query word, times its rarity, when the file defines a name
/// made of it.
const DEFINES_WEIGHT: f64 = 1.5;
/// Added per query word in the file's directory path / in its own name.
const PATH_WEIGHT: f64 = 0.8;
const NAME_WEIGHT: f64 = 1.6;
/// Added per pair of the query's adjacent words, times their mean rarity,
/// when a name the file defines (or its own name) holds them side by side:
/// "data directory" in `data_dir`, "excluded directories" in `exclude_dirs`.
const PHRASE_WEIGHT: f64 = 1.5;
/// Times the summed rarity of the query words on a file's best line, when
/// that line holds at least `PROXIMITY_MIN_WORDS` distinct ones; only the
/// `PROXIMITY_CANDIDATES` leading files are read again for it.
/// (`zopu-bench eval`, dev half: weight 1 and three words gave top-1 0.80 against
/// 0.76 without; 0.5 gave 0.78, 2 gave 0.78, two words 0.76, four 0.78,
/// a three-line window 0.74.)
const PROXIMITY_WEIGHT: f64 = 1.0;
const PROXIMITY_MIN_WORDS: usize = 3;
const PROXIMITY_CANDIDATES: usize = MAX_FILES;
/// A leading file with more words than this (a bundle, a generated table)
/// is not read again for its best line: a query's work stays bounded.
const PROXIMITY_MAX_WORDS: u32 = 50_000;

/// Input of `find_code`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FindCodeInput {
    /// Words, identifiers or a question: split and stemmed like the code.
    pub query: String,
    /// Most files returned (default 10, at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files: Option<usize>,
}

/// A name a file defines, on its line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FoundDefinition {
    pub line: u64,
    pub name: String,
}

/// One ranked file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FoundFile {
    pub path: String,
    pub score: f64,
    /// The query's (stemmed) words the file contains.
    pub matched: Vec<String>,
    /// Definitions whose names contain a query word, first ones first.
    pub definitions: Vec<FoundDefinition>,
    /// The line holding the most of the query's words, when it holds at
    /// least three distinct ones (only among the leading files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_line: Option<u64>,
    /// The other files of these results that it imports or that import it
    /// (Rust modules and `use` paths, Python, JavaScript, TypeScript, Java
    /// and Kotlin imports), in path order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub linked: Vec<String>,
}

/// Output of `find_code`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindCodeOutput {
    /// The query's words as looked up (split, lower case, stemmed).
    pub words: Vec<String>,
    pub files: Vec<FoundFile>,
    pub files_indexed: u64,
    /// The index was already built for this tree (no file was read).
    pub index_reused: bool,
    /// The tree held more than the index's file limit.
    pub truncated: bool,
}

impl ToolOutput for FindCodeOutput {
    fn truncated(&self) -> bool {
        self.truncated
    }
}

/// One indexed file.
#[derive(Debug)]
struct IndexedFile {
    path: String,
    /// Word occurrences in the file's text.
    length: u32,
    /// Word ids of its path's directories, and of its own name.
    directory_words: BTreeSet<u32>,
    name_words: BTreeSet<u32>,
    /// The words of its own name in order (for pairs of query words).
    name_sequence: Vec<u32>,
    /// What it defines: (line, name, the name's word ids).
    definitions: Vec<(u64, String, Vec<u32>)>,
    /// The files it imports (see [`links`]), in file order.
    imports: Vec<u32>,
    /// Its name's one letter, when its name (without extensions) is one
    /// letter: `z.rs` is the importer of the tool called `z`.
    letter_name: Option<char>,
}

/// The index of one tree.
#[derive(Debug, Default)]
pub struct CodeIndex {
    words: HashMap<String, u32>,
    /// Per word id: (file index, occurrences) in file order.
    postings: Vec<Vec<(u32, u32)>>,
    files: Vec<IndexedFile>,
    average_length: f64,
    truncated: bool,
}

/// English words that say nothing about code, dropped from text and
/// queries alike (whatever is left is weighed by its rarity).
#[rustfmt::skip]
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been",
    "before", "being", "but", "by", "can", "could", "did", "do", "does", "doing", "each", "for",
    "from", "had", "has", "have", "how", "if", "in", "into", "is", "it", "its", "may", "me",
    "might", "must", "my", "no", "not", "of", "on", "or", "our", "should", "so", "some", "such",
    "than", "that", "the", "their", "them", "then", "there", "these", "they", "this", "those",
    "to", "too", "us", "very", "was", "we", "were", "what", "when", "where", "whether", "which",
    "while", "who", "why", "will", "with", "would", "you", "your",
    // What a contraction leaves before its apostrophe ("don't" is `don`, `t`).
    "aren", "couldn", "didn", "doesn", "don", "hadn", "hasn", "haven", "isn", "shouldn", "wasn",
    "weren", "won", "wouldn",
];

static STEMMER: LazyLock<Stemmer> = LazyLock::new(|| Stemmer::create(Algorithm::English));

/// The words of `text` as the index keys them: identifiers split at
/// underscores, case changes (`HTTPServer` is `http`, `server`) and
/// letter-digit boundaries, lower-cased, stemmed; single letters,
/// numbers and English stopwords dropped. A single letter followed by
/// digits (and by one or two more letters) stays one word, since split it
/// would vanish whole: `h11_impl` is `h11`, `impl`; `x509`, `k8s`, `i18n`
/// and `a11y` are themselves.
pub fn index_words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for token in text.split(|c: char| !c.is_alphanumeric()) {
        let parts = split_identifier(token);
        let mut at = 0;
        while at < parts.len() {
            if let Some((numeronym, used)) = numeronym(&parts[at..]) {
                out.push(numeronym);
                at += used;
                continue;
            }
            let lower = parts[at].to_lowercase();
            at += 1;
            if lower.chars().count() < 2
                || lower.chars().all(|c| c.is_ascii_digit())
                || STOPWORDS.contains(&lower.as_str())
            {
                continue;
            }
            out.push(STEMMER.stem(&lower).into_owned());
        }
    }
    out
}

/// A single letter, digits and at most two more letters at the start of
/// `parts` as one lower-case word (`h` `11` → `h11`, `k` `8` `s` → `k8s`),
/// with how many parts it took.
fn numeronym(parts: &[&str]) -> Option<(String, usize)> {
    let alphabetic = |part: &str| part.chars().all(char::is_alphabetic);
    let [letter, digits, rest @ ..] = parts else {
        return None;
    };
    if letter.chars().count() != 1
        || !alphabetic(letter)
        || !digits.chars().all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let mut word = format!("{letter}{digits}");
    let mut used = 2;
    if let Some(tail) = rest.first()
        && (1..=2).contains(&tail.chars().count())
        && alphabetic(tail)
    {
        word.push_str(tail);
        used = 3;
    }
    Some((word.to_lowercase(), used))
}

/// `parseHTTPRequest2` → `parse`, `HTTP`, `Request`, `2`.
fn split_identifier(token: &str) -> Vec<&str> {
    let chars: Vec<(usize, char)> = token.char_indices().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    for window in 1..chars.len() {
        let (at, current) = chars[window];
        let previous = chars[window - 1].1;
        let next = chars.get(window + 1).map(|(_, c)| *c);
        let boundary = (previous.is_lowercase() && current.is_uppercase())
            || (previous.is_uppercase()
                && current.is_uppercase()
                && next.is_some_and(char::is_lowercase))
            || (previous.is_alphabetic() != current.is_alphabetic());
        if boundary {
            parts.push(&token[start..at]);
            start = at;
        }
    }
    if start < token.len() {
        parts.push(&token[start..]);
    }
    parts
}

/// Names defined on a line, by language-agnostic and per-language patterns:
/// keyword-introduced definitions (`fn`, `def`, `class`, `func`, …), Go
/// methods, Java/C#-style methods, JavaScript functions assigned to names.
static DEFINITIONS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"\b(?:fn|def|class|struct|func|function|interface|type|enum|trait|mod|module|object|record|macro_rules!)\s+([A-Za-z_][A-Za-z0-9_]*)",
        r"^\s*(?:pub(?:\([a-z]+\))?\s+)?(?:const|static)\s+([A-Z_][A-Z0-9_]*)\s*:",
        r"^func\s+\([^)]*\)\s*([A-Za-z_][A-Za-z0-9_]*)",
        r"^\s*(?:(?:public|private|protected|static|final|abstract|synchronized|native|default|override|internal)\s+)+(?:<[^>]*>\s*)?[A-Za-z_][\w.<>\[\],? ]*?\s+([a-zA-Z_][A-Za-z0-9_]*)\s*\(",
        r"^\s*(?:export\s+)?(?:const|let|var)\s+([A-Za-z_$][\w$]*)\s*=\s*(?:async\s+)?(?:function\b|\([^)]*\)\s*(?::\s*[^=]+?)?=>|[A-Za-z_$][\w$]*\s*=>)",
        r"^\s*(?:module\.)?exports\.([A-Za-z_$][\w$]*)\s*=",
        r"^\s*(?:[A-Za-z_$][\w$]*)\.prototype\.([A-Za-z_$][\w$]*)\s*=",
        r"^\s*impl(?:<[^>]*>)?\s+(?:[A-Za-z_][\w:]*\s+for\s+)?([A-Za-z_][A-Za-z0-9_]*)",
    ]
    .iter()
    .filter_map(|pattern| Regex::new(pattern).ok())
    .collect()
});

fn definitions_on(line: &str) -> impl Iterator<Item = &str> {
    DEFINITIONS
        .iter()
        .filter_map(move |re| re.captures(line))
        .filter_map(|captures| captures.get(1))
        .map(|name| name.as_str())
        .filter(|name| !matches!(*name, "if" | "for" | "while" | "switch" | "return" | "new"))
}

impl CodeIndex {
    fn word_id(&mut self, word: String) -> u32 {
        let next = self.words.len() as u32;
        let id = *self.words.entry(word).or_insert(next);
        if id == next {
            self.postings.push(Vec::new());
        }
        id
    }

    /// Adds a file; returns what it says of other files, resolved once
    /// every file is known.
    fn add(&mut self, path: String, text: &str) -> Vec<links::Reference> {
        let references = links::references(&path, text);
        let file = self.files.len() as u32;
        let mut counts: HashMap<u32, u32> = HashMap::new();
        let mut length = 0u32;
        let mut definitions = Vec::new();
        for (number, line) in text.lines().enumerate() {
            for word in index_words(line) {
                let id = self.word_id(word);
                *counts.entry(id).or_default() += 1;
                length += 1;
            }
            let names: Vec<String> = definitions_on(line).map(str::to_owned).collect();
            for name in names {
                let ids = index_words(&name)
                    .into_iter()
                    .map(|word| self.word_id(word))
                    .collect();
                definitions.push((number as u64 + 1, name, ids));
            }
        }
        let (directory, name) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        // The file's name without its extensions (`res.cookie.js` is `res`, `cooki`).
        let stem = name.split('.').take(name.split('.').count().max(2) - 1);
        let letter_name = single_letter(name.split('.').next().unwrap_or_default());
        let name_sequence: Vec<u32> = stem
            .flat_map(index_words)
            .map(|word| self.word_id(word))
            .collect();
        let name_words = name_sequence.iter().copied().collect();
        let directory_words = index_words(directory)
            .into_iter()
            .map(|word| self.word_id(word))
            .collect();
        let mut counts: Vec<(u32, u32)> = counts.into_iter().collect();
        counts.sort_unstable();
        for (id, count) in counts {
            self.postings[id as usize].push((file, count));
        }
        self.files.push(IndexedFile {
            path,
            length,
            directory_words,
            name_words,
            name_sequence,
            definitions,
            imports: Vec::new(),
            letter_name,
        });
        references
    }

    /// Builds the index of the repository's tree.
    fn build(root: &WorkspaceRoot, limits: &SandboxLimits, files: &[Listed]) -> Self {
        let mut index = Self::default();
        let Ok(repo_fd) = root.open_repo_dir() else {
            return index;
        };
        let mut references = Vec::new();
        for listed in files.iter().take(MAX_INDEXED_FILES) {
            if let Some(text) = readable_text(&repo_fd, &listed.rel, limits) {
                references.push(index.add(listed.rel.as_string(), &text));
            }
        }
        index.resolve_imports(&references);
        index.truncated = files.len() > MAX_INDEXED_FILES;
        let total: u64 = index.files.iter().map(|f| u64::from(f.length)).sum();
        index.average_length = total as f64 / index.files.len().max(1) as f64;
        index
    }

    /// Every file's imports, from what each said of the others.
    fn resolve_imports(&mut self, references: &[Vec<links::Reference>]) {
        let paths: Vec<&str> = self.files.iter().map(|file| file.path.as_str()).collect();
        let resolver = links::Resolver::new(&paths, references);
        let imports: Vec<Vec<u32>> = paths
            .iter()
            .zip(references)
            .map(|(path, references)| resolver.resolve(path, references))
            .collect();
        for (file, imports) in self.files.iter_mut().zip(imports) {
            file.imports = imports;
        }
    }

    /// The line of `text` whose query words weigh most (their summed
    /// rarity), among those holding at least [`PROXIMITY_MIN_WORDS`]
    /// distinct ones: (line number, weight); the first of equals.
    fn best_line(&self, text: &str, rarities: &HashMap<u32, f64>) -> Option<(u64, f64)> {
        let mut best: Option<(u64, f64)> = None;
        for (number, line) in text.lines().enumerate() {
            let held: BTreeSet<u32> = index_words(line)
                .into_iter()
                .filter_map(|word| self.words.get(&word).copied())
                .filter(|id| rarities.contains_key(id))
                .collect();
            if held.len() < PROXIMITY_MIN_WORDS {
                continue;
            }
            let weight: f64 = held.iter().map(|id| rarities[id]).sum();
            if best.is_none_or(|(_, known)| weight > known) {
                best = Some((number as u64 + 1, weight));
            }
        }
        best
    }

    /// Files ranked for `words` (already split and stemmed), best first;
    /// `text_of` reads a file's text again for the line bonus.
    fn rank(
        &self,
        words: &[String],
        letters: &[char],
        pairs: &[(String, String)],
        max_files: usize,
        text_of: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<FoundFile> {
        let files = self.files.len().max(1) as f64;
        let ids: Vec<(u32, &String, f64)> = words
            .iter()
            .filter_map(|word| {
                let id = *self.words.get(word)?;
                let containing = self.postings[id as usize].len() as f64;
                let rarity = (1.0 + (files - containing + 0.5) / (containing + 0.5)).ln();
                Some((id, word, rarity))
            })
            .collect();
        let rarity_of = |word: &String| {
            ids.iter()
                .find(|(_, known, _)| *known == word)
                .map(|(id, _, rarity)| (*id, *rarity))
        };
        let pair_ids: Vec<(u32, u32, f64)> = pairs
            .iter()
            .filter_map(|(first, second)| {
                let (first, first_rarity) = rarity_of(first)?;
                let (second, second_rarity) = rarity_of(second)?;
                Some((first, second, (first_rarity + second_rarity) / 2.0))
            })
            .collect();
        let mut scores: HashMap<u32, (f64, BTreeSet<&String>)> = HashMap::new();
        for (id, word, rarity) in &ids {
            for (file, count) in &self.postings[*id as usize] {
                let length = f64::from(self.files[*file as usize].length);
                let count = f64::from(*count);
                let saturated = count * (BM25_K1 + 1.0)
                    / (count
                        + BM25_K1
                            * (1.0 - BM25_B + BM25_B * length / self.average_length.max(1.0)));
                let entry = scores.entry(*file).or_default();
                entry.0 += rarity * saturated;
                entry.1.insert(word);
            }
        }
        // A letter the query names alone (the tool `z`) is no word, but a
        // file named by it is about it.
        let letter_rarity: Vec<(char, f64)> = letters
            .iter()
            .map(|letter| {
                let named = self
                    .files
                    .iter()
                    .filter(|file| file.letter_name == Some(*letter))
                    .count() as f64;
                (*letter, (1.0 + (files - named + 0.5) / (named + 0.5)).ln())
            })
            .collect();
        for (file_index, file) in self.files.iter().enumerate() {
            let mut bonus = 0.0;
            for (letter, rarity) in &letter_rarity {
                if file.letter_name == Some(*letter) {
                    bonus += NAME_WEIGHT * rarity;
                }
            }
            for (id, _, rarity) in &ids {
                if file.name_words.contains(id) {
                    bonus += NAME_WEIGHT * rarity;
                } else if file.directory_words.contains(id) {
                    bonus += PATH_WEIGHT * rarity;
                }
                if file
                    .definitions
                    .iter()
                    .any(|(_, _, words)| words.contains(id))
                {
                    bonus += DEFINES_WEIGHT * rarity;
                }
            }
            for (first, second, rarity) in &pair_ids {
                let side_by_side = |words: &[u32]| {
                    words
                        .windows(2)
                        .any(|pair| pair[0] == *first && pair[1] == *second)
                };
                if side_by_side(&file.name_sequence)
                    || file
                        .definitions
                        .iter()
                        .any(|(_, _, words)| side_by_side(words))
                {
                    bonus += PHRASE_WEIGHT * rarity;
                }
            }
            if bonus > 0.0 {
                scores.entry(file_index as u32).or_default().0 += bonus;
            }
        }
        let mut ranked: Vec<(u32, f64, BTreeSet<&String>)> = scores
            .into_iter()
            .map(|(file, (score, matched))| (file, score, matched))
            .collect();
        let order = |ranked: &mut Vec<(u32, f64, BTreeSet<&String>)>| {
            ranked.sort_by(|a, b| {
                b.1.total_cmp(&a.1).then_with(|| {
                    self.files[a.0 as usize]
                        .path
                        .cmp(&self.files[b.0 as usize].path)
                })
            });
        };
        order(&mut ranked);
        // One line holding several of the query's words (an error message,
        // a doc comment, a call) tells more than the same words spread over
        // the file: the best such line of each leading file adds its words'
        // rarities.
        let rarities: HashMap<u32, f64> =
            ids.iter().map(|(id, _, rarity)| (*id, *rarity)).collect();
        let mut best_lines: HashMap<u32, u64> = HashMap::new();
        for (file, score, _) in ranked.iter_mut().take(PROXIMITY_CANDIDATES) {
            let indexed = &self.files[*file as usize];
            if indexed.length > PROXIMITY_MAX_WORDS {
                continue;
            }
            if let Some((line, weight)) =
                text_of(&indexed.path).and_then(|text| self.best_line(&text, &rarities))
            {
                *score += PROXIMITY_WEIGHT * weight;
                best_lines.insert(*file, line);
            }
        }
        order(&mut ranked);
        ranked.truncate(max_files);
        let returned: BTreeSet<u32> = ranked.iter().map(|(file, _, _)| *file).collect();
        let imports = |from: u32, to: u32| self.files[from as usize].imports.contains(&to);
        let linked_to = |file_index: u32| -> Vec<String> {
            returned
                .iter()
                .filter(|other| {
                    **other != file_index
                        && (imports(file_index, **other) || imports(**other, file_index))
                })
                .map(|other| self.files[*other as usize].path.clone())
                .collect()
        };
        ranked
            .into_iter()
            .map(|(file_index, score, matched)| {
                let file = &self.files[file_index as usize];
                FoundFile {
                    linked: linked_to(file_index),
                    best_line: best_lines.get(&file_index).copied(),
                    path: file.path.clone(),
                    score: (score * 1000.0).round() / 1000.0,
                    matched: matched.into_iter().cloned().collect(),
                    definitions: file
                        .definitions
                        .iter()
                        .filter(|(_, _, words)| ids.iter().any(|(id, _, _)| words.contains(id)))
                        .take(DEFINITIONS_PER_FILE)
                        .map(|(line, name, _)| FoundDefinition {
                            line: *line,
                            name: name.clone(),
                        })
                        .collect(),
                }
            })
            .collect()
    }
}

/// A file of the tree, with what its cache key depends on.
struct Listed {
    rel: RelPath,
    size: u64,
    modified: Option<std::time::SystemTime>,
}

/// The file's text when it is indexable: a regular file beneath the
/// repository (no symlink or hard link), within the size limit, not binary,
/// not secret-bearing by name or content.
fn readable_text(
    repo_fd: &std::os::fd::OwnedFd,
    rel: &RelPath,
    limits: &SandboxLimits,
) -> Option<String> {
    if zopu_secrets::is_secret_file_name(&rel.as_string()) {
        return None;
    }
    let opened = open_beneath(repo_fd, rel, Expect::File).ok()?;
    if opened.size > limits.max_file_bytes {
        return None;
    }
    let mut file = File::from(opened.fd);
    let mut bytes = Vec::with_capacity(opened.size as usize);
    (&mut file)
        .take(limits.max_file_bytes)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.contains(&0) {
        return None;
    }
    // The text already read is what is checked for secrets (no second read).
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (!zopu_secrets::is_secret_file_content(&text)).then_some(text)
}

/// The repository's files in path order, through the same walk as `search`.
fn listed_files(root: &WorkspaceRoot, limits: &SandboxLimits) -> Result<Vec<Listed>, Error> {
    let (_, dir) = repo_dir(root, limits, "")?;
    let mut builder = walker(&dir, limits.max_depth);
    builder.sort_by_file_path(|a, b| a.cmp(b));
    let mut out = Vec::new();
    for entry in builder.build().flatten() {
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if !metadata.is_file() {
            continue;
        }
        let Some(rel) = repo_relative(root, limits, entry.path()) else {
            continue;
        };
        out.push(Listed {
            rel,
            size: metadata.len(),
            modified: metadata.modified().ok(),
        });
    }
    Ok(out)
}

/// What an index was built from: the repository and every file's path,
/// size and modification time.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TreeKey {
    repo: PathBuf,
    fingerprint: u64,
    max_file_bytes: u64,
}

fn tree_key(root: &WorkspaceRoot, limits: &SandboxLimits, files: &[Listed]) -> TreeKey {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for file in files {
        file.rel.as_string().hash(&mut hasher);
        file.size.hash(&mut hasher);
        file.modified.hash(&mut hasher);
    }
    TreeKey {
        repo: root.repo().to_path_buf(),
        fingerprint: hasher.finish(),
        max_file_bytes: limits.max_file_bytes,
    }
}

/// Indexes by the tree they were built from, most recently used last.
type Cache = Vec<(TreeKey, Arc<CodeIndex>)>;

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// The tree's index, from the cache or built now; and whether it was reused.
fn index_of(root: &WorkspaceRoot, limits: &SandboxLimits) -> Result<(Arc<CodeIndex>, bool), Error> {
    let files = listed_files(root, limits)?;
    let key = tree_key(root, limits, &files);
    {
        let mut cache = CACHE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(at) = cache.iter().position(|(cached, _)| *cached == key) {
            let entry = cache.remove(at);
            let index = Arc::clone(&entry.1);
            cache.push(entry);
            return Ok((index, true));
        }
    }
    let index = Arc::new(CodeIndex::build(root, limits, &files));
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.retain(|(cached, _)| *cached != key);
    cache.push((key, Arc::clone(&index)));
    let excess = cache.len().saturating_sub(CACHED_INDEXES);
    cache.drain(..excess);
    Ok((index, false))
}

pub(crate) fn find_code(
    root: &WorkspaceRoot,
    limits: &SandboxLimits,
    input: &FindCodeInput,
) -> Result<FindCodeOutput, Error> {
    if input.query.trim().is_empty() || input.query.len() > MAX_QUERY_BYTES {
        return Err(Error::InvalidInput(format!(
            "query must be 1..={MAX_QUERY_BYTES} bytes of words"
        )));
    }
    let max_files = input.max_files.unwrap_or(DEFAULT_FILES);
    if !(1..=MAX_FILES).contains(&max_files) {
        return Err(Error::InvalidInput(format!(
            "max_files must be 1..={MAX_FILES}, not {max_files}"
        )));
    }
    let mut seen = BTreeSet::new();
    let words: Vec<String> = index_words(&input.query)
        .into_iter()
        .filter(|word| seen.insert(word.clone()))
        .take(MAX_QUERY_WORDS)
        .collect();
    if words.is_empty() {
        return Err(Error::InvalidInput(
            "query has no word of two or more letters".to_owned(),
        ));
    }
    let (index, index_reused) = index_of(root, limits)?;
    let repo_fd = root.open_repo_dir().ok();
    let text_of = |path: &str| -> Option<String> {
        let rel = RelPath::parse(path, limits).ok()?;
        readable_text(repo_fd.as_ref()?, &rel, limits)
    };
    Ok(FindCodeOutput {
        files: index.rank(
            &words,
            &query_letters(&input.query),
            &adjacent_pairs(&input.query),
            max_files,
            &text_of,
        ),
        words,
        files_indexed: index.files.len() as u64,
        index_reused,
        truncated: index.truncated,
    })
}

/// `token` as a lower-case letter, when it is one ASCII letter.
fn single_letter(token: &str) -> Option<char> {
    let mut chars = token.chars();
    match (chars.next(), chars.next()) {
        (Some(letter), None) if letter.is_ascii_alphabetic() => Some(letter.to_ascii_lowercase()),
        _ => None,
    }
}

/// The letters `query` names alone (`z` in "a z data file"), but for the
/// English words `a` and `I`; a letter inside an identifier is not alone.
fn query_letters(query: &str) -> Vec<char> {
    let mut letters = Vec::new();
    for token in query.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
        if let Some(letter) = single_letter(token)
            && !matches!(letter, 'a' | 'i')
            && !letters.contains(&letter)
        {
            letters.push(letter);
        }
    }
    letters
}

/// The distinct pairs of adjacent words in `query`, as the index keys them.
fn adjacent_pairs(query: &str) -> Vec<(String, String)> {
    let sequence = index_words(query);
    let mut pairs: Vec<(String, String)> = Vec::new();
    for pair in sequence.windows(2) {
        let pair = (pair[0].clone(), pair[1].clone());
        if pair.0 != pair.1 && !pairs.contains(&pair) {
            pairs.push(pair);
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_split_and_stem_like_prose() {
        assert_eq!(
            index_words("parseHTTPRequest2"),
            ["pars", "http", "request"]
        );
        // A letter and digits are a name of their own.
        assert_eq!(index_words("h11_impl"), ["h11", "impl"]);
        assert_eq!(index_words("H11Protocol"), ["h11", "protocol"]);
        assert_eq!(index_words("the h11 library"), ["h11", "librari"]);
        assert_eq!(index_words("base64 x509"), ["base", "x509"]);
        assert_eq!(index_words("k8s i18n a11y"), ["k8s", "i18n", "a11y"]);
        assert_eq!(index_words("x509Cert"), ["x509", "cert"]);
        // A contraction's stub is no word.
        assert_eq!(index_words("when I don't pass a width"), ["pass", "width"]);
        assert_eq!(index_words("parse_config"), index_words("parse the Config"));
        assert_eq!(index_words("left_recursion"), index_words("left-recursive"));
        assert_eq!(index_words("RingBufferTest"), ["ring", "buffer", "test"]);
    }

    #[test]
    fn definitions_are_found_in_each_language() {
        let names = |line: &str| definitions_on(line).map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            names("pub fn validate_rules(rules: &[Rule]) {"),
            ["validate_rules"]
        );
        assert_eq!(
            names("func (mx *Mux) Mount(pattern string, h http.Handler) {"),
            ["Mount"]
        );
        assert_eq!(names("    public long next(int n)"), ["next"]);
        assert_eq!(
            names("def import_from_string(import_str):"),
            ["import_from_string"]
        );
        assert_eq!(
            names("res.cookie = function cookie(name, value, options) {"),
            ["cookie"]
        );
        assert_eq!(
            names("exports.compileETag = function(val) {"),
            ["compileETag"]
        );
        assert_eq!(
            names("export const normalizeOptions = async (opts) => {"),
            ["normalizeOptions"]
        );
        assert_eq!(names("export const shebang = (): Plugin => {"), ["shebang"]);
        assert_eq!(names("impl Display for ParseError {"), ["ParseError"]);
        assert!(names("    if (x) {").is_empty());
    }

    fn sandbox_with(files: &[(&str, &str)]) -> (tempfile::TempDir, crate::tools::Sandbox) {
        let dir = tempfile::tempdir().unwrap();
        for (path, content) in files {
            let full = dir.path().join("repo").join(path);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(full, content).unwrap();
        }
        let root = WorkspaceRoot::open(dir.path()).unwrap();
        let sandbox = crate::tools::Sandbox::new(root, SandboxLimits::default()).unwrap();
        (dir, sandbox)
    }

    fn query(text: &str) -> FindCodeInput {
        FindCodeInput {
            query: text.to_owned(),
            max_files: None,
        }
    }

    #[test]
    fn the_defining_file_ranks_first_and_the_index_is_built_once_per_tree() {
        let (dir, sandbox) = sandbox_with(&[
            (
                "src/throttle.rs",
                "/// Limits how often requests pass.\npub struct RateLimiter {\n    per_second: u32,\n}\n",
            ),
            (
                "src/server.rs",
                "use crate::throttle::RateLimiter;\n// every request goes through the rate limiter\nfn serve(limiter: &RateLimiter) {}\n",
            ),
            ("README.md", "Requests are rate limited.\n"),
            (".env", "RATE_LIMIT_SECRET=hunter2hunter2\n"),
        ]);
        let first = sandbox
            .find_code(&query("Where is the rate limiter?"))
            .unwrap();
        assert!(!first.index_reused);
        assert_eq!(first.words, ["rate", "limit"]);
        assert_eq!(first.files[0].path, "src/throttle.rs", "{first:?}");
        assert_eq!(
            first.files[0].definitions,
            [FoundDefinition {
                line: 2,
                name: "RateLimiter".into()
            }]
        );
        // server.rs imports throttle.rs: each names the other as linked.
        let server = first
            .files
            .iter()
            .find(|f| f.path == "src/server.rs")
            .unwrap();
        assert_eq!(server.linked, ["src/throttle.rs"], "{first:?}");
        assert_eq!(first.files[0].linked, ["src/server.rs"], "{first:?}");
        assert!(
            first.files.iter().all(|file| file.path != ".env"),
            "a secret-bearing file is never indexed: {first:?}"
        );
        let again = sandbox.find_code(&query("rate limiting")).unwrap();
        assert!(again.index_reused, "same tree, same index");
        // A changed tree is indexed anew.
        std::fs::write(
            dir.path().join("repo/src/quota.rs"),
            "pub fn rate_limit_quota() {}\n",
        )
        .unwrap();
        let changed = sandbox.find_code(&query("rate limit quota")).unwrap();
        assert!(!changed.index_reused);
        assert_eq!(changed.files[0].path, "src/quota.rs");
    }

    #[test]
    fn a_line_holding_several_of_the_question_s_words_ranks_its_file_first() {
        let (_dir, sandbox) = sandbox_with(&[
            (
                "src/mux.rs",
                "fn use_layer(&mut self) {\n    if self.handler.is_some() {\n        panic!(\"middlewares must be added before routes\");\n    }\n}\n",
            ),
            (
                "src/chain.rs",
                "// A middleware chain: each middleware wraps the next.\nfn chain(middleware: Middleware) {}\n// Routes are matched after the chain.\nfn routes() {}\n// A panic in a handler is recovered.\nfn recover() {}\n",
            ),
            ("src/main.rs", "fn main() {\n    run();\n}\n"),
        ]);
        let found = sandbox
            .find_code(&query(
                "Why do I get a panic when I add middleware after routes?",
            ))
            .unwrap();
        // chain.rs mentions and defines the words more often; mux.rs says
        // three of them on one line.
        assert_eq!(found.files[0].path, "src/mux.rs", "{found:?}");
        // The line that said them is pointed to.
        assert_eq!(found.files[0].best_line, Some(3), "{found:?}");
    }

    #[test]
    fn a_name_holding_the_question_s_words_side_by_side_ranks_first() {
        let (_dir, sandbox) = sandbox_with(&[
            (
                "src/config.rs",
                "pub fn data_dir() -> PathBuf {\n    env_path()\n}\n",
            ),
            (
                "src/import.rs",
                "// Reads the data of another tool's directory: every directory\n// listed in its data file.\nfn dirs(data: &str) {}\nfn data_path() {}\n",
            ),
            ("src/main.rs", "fn main() {\n    run();\n}\n"),
        ]);
        let found = sandbox
            .find_code(&query("Where is the data dir chosen?"))
            .unwrap();
        // import.rs mentions and defines both words more often; config.rs
        // defines them together.
        assert_eq!(found.files[0].path, "src/config.rs", "{found:?}");
        assert_eq!(
            adjacent_pairs("the data dir, chosen"),
            [
                ("data".to_owned(), "dir".to_owned()),
                ("dir".to_owned(), "chosen".to_owned())
            ]
        );
    }

    #[test]
    fn a_file_named_by_a_letter_the_question_names_alone_ranks_first() {
        let mut files = vec![
            (
                "src/import/z.rs".to_owned(),
                "fn parse(line: &str) -> Option<Dir> {\n    let (path, rest) = line.split_once('|')?;\n}\n".to_owned(),
            ),
            (
                "src/import/autojump.rs".to_owned(),
                "// Reads autojump's file.\nfn parse(line: &str) {}\n".to_owned(),
            ),
        ];
        for number in 0..10 {
            files.push((
                format!("src/cmd/command{number}.rs"),
                "fn run() {}\n".to_owned(),
            ));
        }
        let borrowed: Vec<(&str, &str)> = files
            .iter()
            .map(|(path, text)| (path.as_str(), text.as_str()))
            .collect();
        let (_dir, sandbox) = sandbox_with(&borrowed);
        let found = sandbox
            .find_code(&query("How are the lines of a z data file parsed?"))
            .unwrap();
        // autojump.rs holds more of the words; z.rs is named by the tool.
        assert_eq!(found.files[0].path, "src/import/z.rs", "{found:?}");
        assert_eq!(query_letters("a z data file, and I: x_y R"), ['z', 'r']);
    }

    #[test]
    fn an_empty_or_wordless_query_and_a_bad_file_count_are_refused() {
        let (_dir, sandbox) = sandbox_with(&[("src/lib.rs", "pub fn run() {}\n")]);
        for bad in ["", "   ", "? ! a"] {
            let error = sandbox.find_code(&query(bad)).unwrap_err();
            assert!(matches!(error, Error::InvalidInput(_)), "{bad:?}: {error}");
        }
        let error = sandbox
            .find_code(&FindCodeInput {
                query: "run".into(),
                max_files: Some(0),
            })
            .unwrap_err();
        assert!(error.to_string().contains("max_files"), "{error}");
    }
}
