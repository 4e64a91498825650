//! A message lower-cased into words, with the polite prefix separated from
//! the first verb, and the questions the rules ask of it (does it ask for
//! a status, an issue, a change, a check, an overview...).

use zopu_core::keywords::{ranked_terms, tokens};

use super::{
    CHANGE_VERBS, CHECK_PHRASES, DELIVERY_PHRASES, DELIVERY_VERBS, GREETING_OR_THANKS,
    INTERROGATIVES, ISSUE_NOUNS, ISSUE_PHRASES, ISSUE_VERBS, PLEASANTRY_OPENERS, POLITE_PREFIXES,
    STATUS_NEUTRAL, STATUS_PHRASES,
};

/// A message lower-cased into words, with the polite prefix separated from the first verb.
pub(super) struct Normalized {
    /// Words joined by single spaces, padded with a space on both sides.
    pub(super) padded: String,
    pub(super) words: Vec<String>,
    /// Words after polite prefixes ("can you", "please", ...).
    pub(super) rest: Vec<String>,
    pub(super) polite: bool,
    pub(super) question_mark: bool,
}

impl Normalized {
    pub(super) fn new(text: &str) -> Self {
        let words: Vec<String> = text
            .split(|c: char| !(c.is_alphanumeric() || c == '\'' || c == '_'))
            .map(|word| word.trim_matches('\'').to_lowercase())
            .filter(|word| !word.is_empty())
            .collect();
        let mut rest: &[String] = &words;
        let mut polite = false;
        'strip: loop {
            for prefix in POLITE_PREFIXES {
                let parts: Vec<&str> = prefix.split(' ').collect();
                if rest.len() > parts.len()
                    && rest.iter().zip(&parts).all(|(word, part)| word == part)
                {
                    rest = &rest[parts.len()..];
                    polite = true;
                    continue 'strip;
                }
            }
            break;
        }
        let rest = rest.to_vec();
        Self {
            padded: format!(" {} ", words.join(" ")),
            words,
            rest,
            polite,
            question_mark: text.trim_end().ends_with('?'),
        }
    }

    pub(super) fn contains_any(&self, phrases: &[&str]) -> bool {
        phrases
            .iter()
            .any(|phrase| self.padded.contains(&format!(" {phrase} ")))
    }

    pub(super) fn first_rest(&self) -> Option<&str> {
        self.rest.first().map(String::as_str)
    }

    pub(super) fn has_subject(&self) -> bool {
        !ranked_terms(&self.words.join(" ")).is_empty()
    }

    /// Greetings, thanks and acknowledgements: only such words, or opened by one with no subject
    /// and no question.
    pub(super) fn is_pleasantry(&self) -> bool {
        self.words
            .iter()
            .all(|word| GREETING_OR_THANKS.contains(&word.as_str()))
            || (self
                .words
                .first()
                .is_some_and(|word| PLEASANTRY_OPENERS.contains(&word.as_str()))
                && !self.question_mark
                && !self.has_subject())
    }

    pub(super) fn is_question(&self) -> bool {
        self.question_mark
            || self
                .first_rest()
                .is_some_and(|word| INTERROGATIVES.contains(&word))
            || self
                .words
                .first()
                .is_some_and(|word| INTERROGATIVES.contains(&word.as_str()))
    }

    /// A question that does not start as a polite request ("how does X work?").
    pub(super) fn is_check_request(&self) -> bool {
        const ASKS_ABOUT: &[&str] = &[
            "how", "where", "why", "what", "whats", "what's", "which", "who", "when",
        ];
        self.contains_any(CHECK_PHRASES)
            && !self
                .words
                .first()
                .is_some_and(|word| ASKS_ABOUT.contains(&word.as_str()))
    }

    /// "How do I run the tests?", "What's the build command?": a question
    /// about running, building or testing the project, which onboarding's
    /// commands answer.
    pub(super) fn is_command_question(&self) -> bool {
        const ASKS: &[&str] = &["how", "what", "whats", "what's", "which", "where"];
        const HOW_TO: &[&str] = &["do", "to", "can", "should"];
        const VERBS: &[&str] = &[
            "run", "build", "compile", "test", "start", "install", "lint",
        ];
        const NOUNS: &[&str] = &[
            "run", "build", "test", "tests", "start", "install", "lint", "dev", "compile",
        ];
        let has = |set: &[&str]| self.words.iter().any(|word| set.contains(&word.as_str()));
        let Some(first) = self.words.first() else {
            return false;
        };
        // "how do I run the tests", "how to build it"
        let how_to = first == "how"
            && self
                .words
                .get(1)
                .is_some_and(|w| HOW_TO.contains(&w.as_str()))
            && has(VERBS);
        // "what's the test command", "which command builds it"
        let which_command = ASKS.contains(&first.as_str())
            && has(&["command", "commands"])
            && (has(NOUNS)
                || self
                    .words
                    .iter()
                    .any(|w| w.starts_with("build") || w.starts_with("test")));
        how_to || which_command
    }

    pub(super) fn is_plain_question(&self) -> bool {
        !self.polite
            && self
                .words
                .first()
                .is_some_and(|word| INTERROGATIVES.contains(&word.as_str()))
    }

    pub(super) fn is_status_question(&self) -> bool {
        if self.contains_any(STATUS_PHRASES) {
            return true;
        }
        let mentions_status = self
            .words
            .iter()
            .any(|word| matches!(word.as_str(), "status" | "eta"));
        mentions_status
            && tokens(&self.words.join(" "))
                .iter()
                .all(|(token, stem)| stem.is_none() || STATUS_NEUTRAL.contains(token))
    }

    pub(super) fn is_issue_request(&self) -> bool {
        if self.contains_any(ISSUE_PHRASES) {
            return true;
        }
        if self.is_plain_question() {
            return false;
        }
        // An issue verb followed within four words by an issue noun: "draft a short ticket".
        self.rest.iter().enumerate().any(|(index, word)| {
            ISSUE_VERBS.contains(&word.as_str())
                && self.rest[index + 1..]
                    .iter()
                    .take(4)
                    .any(|next| ISSUE_NOUNS.contains(&next.as_str()))
        })
    }

    pub(super) fn is_delivery_request(&self) -> bool {
        if self.is_plain_question() {
            return false;
        }
        self.first_rest()
            .is_some_and(|word| DELIVERY_VERBS.contains(&word))
            || self.contains_any(DELIVERY_PHRASES)
    }

    pub(super) fn is_change_request(&self) -> bool {
        !self.is_plain_question()
            && self
                .first_rest()
                .is_some_and(|word| CHANGE_VERBS.contains(&word))
    }
}
