//! Text shown to operators, made safe for a terminal: keys and text read from servers (a
//! foreign holder's value, a server's error message) may carry escape sequences, line
//! breaks or bidirectional-text controls that would recolour, rewrite or reorder what the
//! operator reads. Everything printed that can contain such text goes through here.
//!
//! One rule everywhere, Rust's own: a character is escaped exactly when `{:?}` escapes
//! it (control characters, bidi and other invisible format characters, combining
//! marks), and it is written the way `{:?}` writes it (`\u{1b}`, `\n`), or as `\u001b`
//! in JSON.

use std::borrow::Cow;

/// `text` in double quotes with Rust's `{:?}` escapes (`"esc\u{1b}[31mred"`): how keys
/// and server text appear inside exec's and status's messages.
pub fn quoted(text: &str) -> String {
    format!("{text:?}")
}

/// `line` with every unsafe character escaped as `{:?}` would (`\u{1b}`); quotes,
/// backslashes and everything printable are kept as they are. For whole messages that
/// may embed server text, such as errors from a backend.
pub fn line(line: &str) -> Cow<'_, str> {
    if !line.chars().any(is_unsafe) {
        return Cow::Borrowed(line);
    }
    let mut out = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        if is_unsafe(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Serialised JSON with every unsafe character inside its strings written as a `\uXXXX`
/// escape: the same JSON value, which no terminal interprets. The line breaks of pretty
/// printing are kept (inside strings the serialiser has escaped them already).
pub fn json(serialized: &str) -> Cow<'_, str> {
    if !serialized.chars().any(|c| c != '\n' && is_unsafe(c)) {
        return Cow::Borrowed(serialized);
    }
    let mut out = String::with_capacity(serialized.len() + 8);
    for c in serialized.chars() {
        if c != '\n' && is_unsafe(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `{:?}` escapes `c` (control and format characters, combining marks on
/// their own, and so on), not counting quotes and backslashes, which are harmless on a
/// terminal.
fn is_unsafe(c: char) -> bool {
    !matches!(c, '"' | '\'' | '\\') && c.escape_debug().next() != Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_bidi_and_invisible_characters_are_escaped() {
        for (raw, shown) in [
            ("esc\u{1b}[31mred", "esc\\u{1b}[31mred"),
            ("two\nlines\r", "two\\nlines\\r"),
            ("csi\u{9b}1m", "csi\\u{9b}1m"),
            ("del\u{7f}", "del\\u{7f}"),
            ("\u{202e}evil", "\\u{202e}evil"),
            ("zero\u{200b}width", "zero\\u{200b}width"),
        ] {
            assert_eq!(line(raw), shown);
            assert_eq!(quoted(raw), format!("\"{shown}\""));
        }
    }

    #[test]
    fn printable_text_is_kept() {
        for text in ["reports/nightly", "a \"b\" c\\d 'e'", "café 日本 🔒"] {
            assert!(matches!(line(text), Cow::Borrowed(_)), "{text}");
        }
    }

    #[test]
    fn json_escapes_stay_json() {
        let value = serde_json::json!({ "key": "esc\u{1b}[31m\u{9b}\u{202e}\u{7f}\n\"\\ 🔒" });
        let text = serde_json::to_string_pretty(&value).unwrap();
        let safe = json(&text);
        assert!(!safe.chars().any(|c| c != '\n' && is_unsafe(c)), "{safe}");
        assert!(
            safe.contains("\\u001b") && safe.contains("\\u202e"),
            "{safe}"
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, value);
    }
}
