//! Helpers of the unit tests.

/// Fails, naming it, unless every one of `parts` is in `text`.
pub fn assert_contains_all(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "{part:?} is not in:\n{text}");
    }
}
