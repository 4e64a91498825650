//! Text limits for what goes into events and records.

/// The longest prefix of `text` of at most `max` bytes that ends on a
/// character boundary.
pub fn clip_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// At most `max` characters of `text`; when it had to be cut, the last of
/// them is `…`.
pub fn clip_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some(_) if max == 0 => String::new(),
        Some(_) => {
            let mut clipped: String = text.chars().take(max.saturating_sub(1)).collect();
            clipped.push('…');
            clipped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{clip_bytes, clip_chars};

    #[test]
    fn clips_to_at_most_max_characters_marking_the_cut() {
        assert_eq!(clip_chars("short", 5), "short");
        assert_eq!(clip_chars("abcdef", 4), "abc…");
        assert_eq!(clip_chars("ééééé", 3).chars().count(), 3);
        assert_eq!(clip_chars("abc", 0), "");
    }

    #[test]
    fn clips_on_a_character_boundary() {
        assert_eq!(clip_bytes("short", 10), "short");
        assert_eq!(clip_bytes("abcdef", 3), "abc");
        // "é" is two bytes: cutting inside it keeps the text before it.
        assert_eq!(clip_bytes("aé", 2), "a");
    }
}
