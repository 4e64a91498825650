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

#[cfg(test)]
mod tests {
    use super::clip_bytes;

    #[test]
    fn clips_on_a_character_boundary() {
        assert_eq!(clip_bytes("short", 10), "short");
        assert_eq!(clip_bytes("abcdef", 3), "abc");
        // "é" is two bytes: cutting inside it keeps the text before it.
        assert_eq!(clip_bytes("aé", 2), "a");
    }
}
