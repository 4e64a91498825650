//! Subject words of a request: the lexicon (stopwords, generic request words) and the light
//! stemmer that both the conversation's offline rules (is a subject named? which topic?) and the
//! specialists' exploration (which terms to search?) read a user's words with. Pure and
//! deterministic: same text, same words, on every machine.

/// Most keywords [`keywords`] returns.
pub const KEYWORDS_MAX: usize = 16;

#[rustfmt::skip]
const STOPWORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "anything",
    "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both",
    "but", "by", "can", "could", "did", "do", "does", "doing", "don", "done", "down", "during",
    "each", "else", "etc", "even", "ever", "every", "few", "for", "from", "further", "get", "gets",
    "getting", "go", "goes", "going", "got", "had", "has", "have", "having", "he", "her", "here",
    "hers", "him", "his", "how", "however", "i", "if", "im", "in", "into", "is", "isn", "it", "its",
    "itself", "just", "know", "let", "lets", "like", "ll", "look", "looking", "make", "me", "might",
    "more", "most", "much", "must", "my", "need", "needs", "no", "nor", "not", "now", "of", "off",
    "ok", "okay", "on", "once", "one", "only", "or", "other", "our", "ours", "out", "over", "own",
    "please", "pls", "quite", "re", "really", "same", "see", "she", "should", "show", "so", "some",
    "something", "still", "such", "sure", "tell", "than", "that", "the", "their", "them", "then",
    "there", "these", "they", "thing", "things", "this", "those", "through", "to", "too", "under",
    "until", "up", "us", "ve", "very", "want", "was", "we", "were", "what", "whats", "when",
    "where", "whether", "which", "while", "who", "whom", "why", "will", "with", "within", "would",
    "yet", "you", "your", "yours", "explain", "understand", "help", "hey", "hi", "hello", "thanks",
    "thank", "stuff", "way", "ways", "kind", "bit", "maybe", "actually", "basically", "two",
    "three", "never", "always", "ensure", "guarantee", "sure", "happen", "happens", "whose",
    "whoever", "whatever", "whichever", "onto", "upon", "via", "against", "among", "across",
    "toward", "towards", "though", "although", "whereas", "myself", "yourself",
    "himself", "herself", "ourselves", "themselves",
];

/// Words that do not name a subject: a message made only of these (and stopwords) is vague.
#[rustfmt::skip]
const GENERIC_WORDS: &[&str] = &[
    "fix", "fixe", "change", "update", "work", "works", "working", "broken", "break", "wrong",
    "problem", "issue", "bug", "error", "code", "part", "better", "again", "asap", "quick",
    "quickly", "please", "check", "take", "try", "do", "handle", "sort", "deal", "improve", "clean",
    "create", "draft", "write", "open", "raise", "ticket", "report", "repo", "repository",
    "project", "codebase",
];

/// Subject words of `text`: lower-cased, stopwords and generic request words removed, lightly
/// stemmed, ranked by frequency (identifier-looking words count double), then first appearance.
pub fn keywords(text: &str) -> Vec<String> {
    ranked_terms(text)
        .into_iter()
        .map(|term| term.stem)
        .collect()
}

/// A subject word of a text: its stem, its weight (identifier-looking words count double) and
/// the position of its first token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub stem: String,
    pub weight: u32,
    pub first: usize,
}

/// The tokens of `text` in order, each with its stem when it names a subject.
pub fn tokens(text: &str) -> Vec<(&str, Option<String>)> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|token| !token.is_empty())
        .map(|token| (token, subject_stem(token)))
        .collect()
}

fn subject_stem(token: &str) -> Option<String> {
    let lower = token.to_lowercase();
    if lower.chars().count() < 2
        || lower.chars().all(|c| c.is_ascii_digit())
        || STOPWORDS.contains(&lower.as_str())
        || GENERIC_WORDS.contains(&lower.as_str())
    {
        return None;
    }
    let stem = stem(&lower);
    (!GENERIC_WORDS.contains(&stem.as_str())).then_some(stem)
}

/// `snake_case` or `camelCase` (not a capitalised or all-caps word).
pub fn is_identifier(token: &str) -> bool {
    token.contains('_')
        || (token.chars().any(char::is_lowercase) && token.chars().skip(1).any(char::is_uppercase))
}

/// The subject words of `text`, ranked (see [`keywords`]), at most [`KEYWORDS_MAX`].
pub fn ranked_terms(text: &str) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::new();
    for (position, (token, stem)) in tokens(text).into_iter().enumerate() {
        let Some(stem) = stem else { continue };
        let weight = if is_identifier(token) { 2 } else { 1 };
        match terms.iter_mut().find(|term| term.stem == stem) {
            Some(term) => term.weight += weight,
            None => terms.push(Term {
                stem,
                weight,
                first: position,
            }),
        }
    }
    terms.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.first.cmp(&b.first)));
    terms.truncate(KEYWORDS_MAX);
    terms
}

/// Words code usually abbreviates, and how: a question says "environment
/// variables" where the code says `env`.
const ABBREVIATIONS: &[(&str, &[&str])] = &[
    ("environment", &["env"]),
    ("directory", &["dir"]),
    ("configuration", &["config", "cfg"]),
    ("parameter", &["param"]),
    ("argument", &["args"]),
    ("database", &["db"]),
    ("message", &["msg"]),
    ("repository", &["repo"]),
    ("application", &["app"]),
    ("initialize", &["init"]),
    ("initialization", &["init"]),
    ("authentication", &["auth"]),
    ("temporary", &["tmp", "temp"]),
    ("request", &["req"]),
    ("response", &["resp"]),
    ("command", &["cmd"]),
    ("error", &["err"]),
    ("attribute", &["attr"]),
    ("package", &["pkg"]),
    ("expression", &["expr"]),
    ("regular", &["regex", "regexp"]),
    ("context", &["ctx"]),
    ("utility", &["util"]),
    ("synchronize", &["sync"]),
    ("commonjs", &["cjs"]),
    ("declaration", &["dts", "decl"]),
];

/// The forms of a subject word's stem to look for in code, in paths and in
/// definitions: its [`search_root`] and the abbreviations code uses for it.
pub fn code_forms(stem: &str) -> Vec<String> {
    let mut forms = vec![search_root(stem)];
    // A word ending in `s` ("commonjs") is looked up by the stem it gives.
    if let Some((_, short)) = ABBREVIATIONS
        .iter()
        .find(|(word, _)| *word == stem || word.strip_suffix('s') == Some(stem))
    {
        forms.extend(short.iter().map(|form| (*form).to_owned()));
    }
    forms
}

/// Light suffix stripping: plurals, `-ing`, `-ed`, with doubled consonants undone.
/// The root a subject word's stem shares with its other forms in code, for
/// searching: agent and action suffixes cut while at least four letters
/// remain ("publisher" finds `publish`, `Publisher`, `published`; "writer"
/// finds `write`). Anything but lowercase letters (an identifier) is kept.
pub fn search_root(stem: &str) -> String {
    if !stem.chars().all(|c| c.is_ascii_lowercase()) {
        return stem.to_owned();
    }
    for suffix in ["ations", "ation", "ments", "ment", "ers", "er"] {
        if let Some(root) = stem.strip_suffix(suffix)
            && root.len() >= 4
        {
            return root.to_owned();
        }
    }
    stem.to_owned()
}

fn stem(word: &str) -> String {
    let len = word.chars().count();
    let stripped = if len > 4 && word.ends_with("ies") {
        format!("{}y", &word[..word.len() - 3])
    } else if len > 5 && word.ends_with("ing") {
        undouble(&word[..word.len() - 3])
    } else if len > 4 && word.ends_with("ed") && !word.ends_with("eed") {
        undouble(&word[..word.len() - 2])
    } else if len > 3
        && word.ends_with('s')
        && !(word.ends_with("ss") || word.ends_with("us") || word.ends_with("is"))
    {
        word[..word.len() - 1].to_owned()
    } else {
        word.to_owned()
    };
    if stripped.chars().count() < 2 {
        word.to_owned()
    } else {
        stripped
    }
}

fn undouble(word: &str) -> String {
    let bytes = word.as_bytes();
    match bytes {
        [.., a, b]
            if a == b
                && a.is_ascii_alphabetic()
                && !matches!(a, b'l' | b's' | b'z' | b'e' | b'o') =>
        {
            word[..word.len() - 1].to_owned()
        }
        _ => word.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_forms_add_the_abbreviations_code_uses() {
        assert_eq!(code_forms("environment"), ["environ", "env"]);
        assert_eq!(code_forms("publisher"), ["publish"]);
        assert_eq!(code_forms(&stem("commonjs")), ["commonj", "cjs"]);
    }

    #[test]
    fn search_roots_find_other_forms_and_leave_identifiers() {
        assert_eq!(search_root("publisher"), "publish");
        assert_eq!(search_root("writer"), "writ");
        assert_eq!(search_root("user"), "user");
        assert_eq!(search_root("deployment"), "deploy");
        assert_eq!(search_root("fork"), "fork");
        assert_eq!(search_root("parse_config"), "parse_config");
        assert_eq!(search_root("SessionStore"), "SessionStore");
    }

    #[test]
    fn keywords_are_filtered_stemmed_and_ranked() {
        assert_eq!(
            keywords("Why are the payment tests failing? The payments retry is failing too"),
            vec!["payment", "fail", "test", "retry"]
        );
        assert_eq!(
            keywords("How does session_store handle sessions?")[0],
            "session_store"
        );
        assert!(keywords("can you please help me with this thing?").is_empty());
        assert_eq!(
            keywords("stopped running queries"),
            vec!["stop", "run", "query"]
        );
        // Function words are never subjects.
        assert_eq!(
            keywords("How does a script whose first line is a shebang end up executable via tsup?"),
            vec![
                "script",
                "first",
                "line",
                "shebang",
                "end",
                "executable",
                "tsup"
            ]
        );
    }

    #[test]
    fn tokens_keep_order_and_mark_subject_words() {
        let tokens = tokens("fix the SessionStore, please");
        let subjects: Vec<&str> = tokens
            .iter()
            .filter(|(_, stem)| stem.is_some())
            .map(|(token, _)| *token)
            .collect();
        assert_eq!(subjects, ["SessionStore"]);
        assert_eq!(tokens.len(), 4);
        assert!(is_identifier("session_store") && is_identifier("sessionStore"));
        assert!(!is_identifier("Session") && !is_identifier("API"));
    }
}
