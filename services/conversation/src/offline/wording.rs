//! Pieces of the offline replies' wording: the message's topic, the
//! project's label, a short quote of the message, the summary's first
//! sentence.

use zopu_core::keywords::{Term, is_identifier, ranked_terms, tokens};

use super::{
    CHANGE_VERBS, PROJECT_NAME_MAX_CHARS, QUOTE_MAX_WORDS, SUMMARY_MAX_WORDS, TOPIC_WORD_MAX_CHARS,
    TOPIC_WORDS, clip_chars,
};

/// The run of subject words around the top keyword, as written ("flaky payment tests"), else
/// the quoted message, else "that".
pub(super) fn topic(message_text: &str) -> String {
    let fallback =
        || quote(message_text).map_or_else(|| "that".to_owned(), |quote| format!("“{quote}”"));
    let tokens = tokens(message_text);
    // "Add a token revoke command" is about the command, not the adding: a
    // change verb is the subject only when nothing else is named. A term's
    // `first` is the place of its first token.
    let terms = ranked_terms(message_text);
    let is_change_verb = |term: &&Term| {
        tokens
            .get(term.first)
            .is_some_and(|(token, _)| CHANGE_VERBS.contains(&token.to_lowercase().as_str()))
    };
    let Some(top) = terms
        .iter()
        .find(|term| !is_change_verb(term))
        .or(terms.first())
    else {
        return fallback();
    };
    let center = top.first;
    if center >= tokens.len() {
        return fallback();
    }
    let (mut start, mut end) = (center, center + 1);
    while end - start < TOPIC_WORDS {
        if start > 0 && tokens[start - 1].1.is_some() {
            start -= 1;
        } else if end < tokens.len() && tokens[end].1.is_some() {
            end += 1;
        } else {
            break;
        }
    }
    let words: Vec<String> = tokens[start..end]
        .iter()
        .map(|(token, _)| {
            let shown = if is_identifier(token) || token.chars().all(|c| !c.is_lowercase()) {
                (*token).to_owned()
            } else {
                token.to_lowercase()
            };
            clip_chars(&shown, TOPIC_WORD_MAX_CHARS)
        })
        .collect();
    words.join(" ")
}

pub(super) fn project_label(project_name: &str) -> String {
    let name: String = project_name
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if name.is_empty() {
        "the project".to_owned()
    } else {
        clip_chars(&name, PROJECT_NAME_MAX_CHARS)
    }
}

pub(super) fn quote(message_text: &str) -> Option<String> {
    let words: Vec<&str> = message_text
        .split_whitespace()
        .map(|word| word.trim_matches(|c: char| !c.is_alphanumeric() && c != '\''))
        .filter(|word| !word.is_empty())
        .collect();
    if words.is_empty() || words.len() > QUOTE_MAX_WORDS {
        return None;
    }
    Some(
        words
            .iter()
            .map(|word| clip_chars(word, TOPIC_WORD_MAX_CHARS))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The first sentence of the summary's prose: headings are skipped, and so
/// is a line that is one emphasised note (`summary.md` opens with an
/// italic line saying which flow wrote it, at which commit).
pub(super) fn first_sentence(summary: &str) -> Option<String> {
    let is_note = |line: &str| {
        line.len() > 1
            && ((line.starts_with('_') && line.ends_with('_'))
                || (line.starts_with('*') && line.ends_with('*') && !line.starts_with("* ")))
    };
    let text = summary
        .lines()
        .map(str::trim)
        .filter(|line| !line.starts_with('#') && !is_note(line))
        .map(|line| line.trim_start_matches(['-', '*', '>', ' ']).trim())
        .find(|line| !line.is_empty())?;
    let end = text
        .char_indices()
        .find(|&(index, c)| {
            matches!(c, '.' | '!' | '?') && text[index + c.len_utf8()..].starts_with(' ')
        })
        .map_or(text.len(), |(index, c)| index + c.len_utf8());
    let words: Vec<&str> = text[..end]
        .split_whitespace()
        .take(SUMMARY_MAX_WORDS)
        .collect();
    let mut sentence = words.join(" ");
    if !sentence.ends_with(['.', '!', '?']) {
        sentence.push('.');
    }
    Some(sentence)
}
