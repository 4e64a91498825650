//! The near-duplicate guardrail every agent output passes (the built-in
//! agent's and external agents' alike): how similar two texts are, the
//! most similar earlier output, and what a repetition looks like to a reader.

use zopu_runtime::text::clip_chars;

fn words(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !c.is_alphanumeric())
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Similarity of two texts (the near-duplicate guardrail every agent
/// output passes, the built-in agent's and external agents' alike) in `[0, 1]`: Jaccard over word bigrams (words for
/// one-word texts), after lowercasing and dropping punctuation.
pub fn similarity(a: &str, b: &str) -> f64 {
    fn grams(text: &str) -> std::collections::BTreeSet<String> {
        let words = words(text);
        if words.len() < 2 {
            return words.into_iter().collect();
        }
        words
            .windows(2)
            .map(|pair| format!("{} {}", pair[0], pair[1]))
            .collect()
    }
    let (a, b) = (grams(a), grams(b));
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let shared = a.intersection(&b).count() as f64;
    let all = a.union(&b).count() as f64;
    shared / all
}

/// The most similar earlier output, when it is at least `threshold` similar.
pub fn near_duplicate<'a>(
    candidate: &str,
    recent: &'a [String],
    threshold: f64,
) -> Option<(&'a str, f64)> {
    recent
        .iter()
        .map(|earlier| (earlier.as_str(), similarity(candidate, earlier)))
        .filter(|(_, score)| *score >= threshold)
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// What the near-duplicate guard found, in words a reader acts on: whether
/// `candidate` repeats `earlier` word for word (after case and punctuation)
/// or mostly, and the earlier text (clipped to `max_chars`).
pub fn describe_repetition(earlier: &str, score: f64, max_chars: usize) -> String {
    let quoted = clip_chars(earlier, max_chars);
    if score >= 1.0 {
        format!("repeats, word for word, the earlier output \"{quoted}\"")
    } else {
        format!(
            "repeats most of the earlier output \"{quoted}\" (the same wording, lightly changed)"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{describe_repetition, near_duplicate};

    #[test]
    fn a_repetition_is_described_by_what_was_repeated_never_as_a_percentage() {
        let recent = vec!["The envelope carries ce- headers.".to_owned()];
        let (earlier, score) =
            near_duplicate("the envelope carries CE headers", &recent, 0.85).expect("a repeat");
        let exact = describe_repetition(earlier, score, 80);
        assert_eq!(
            exact,
            "repeats, word for word, the earlier output \"The envelope carries ce- headers.\""
        );
        let partly = describe_repetition(earlier, 0.9, 10);
        assert!(
            partly.starts_with("repeats most of the earlier output \"The envel…\""),
            "{partly}"
        );
        assert!(!exact.contains('%') && !partly.contains('%'));
    }
}
