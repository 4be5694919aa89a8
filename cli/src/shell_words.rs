//! `--launcher-args "-F './my config'"` split into words as a POSIX shell would split
//! them, quoting included, so that one option's value may hold spaces
//! (`--mca plm_rsh_args '-F ssh_config'`). Only quoting: no variables, globs or
//! command substitution.

/// One argument's words, as clap's value (a `Vec` field would be taken for repeated
/// arguments).
#[derive(Debug, Clone)]
pub(crate) struct Words(pub(crate) Vec<String>);

impl Words {
    /// [`split`] for clap.
    pub(crate) fn parse(text: &str) -> Result<Words, String> {
        split(text).map(Words)
    }
}

/// The words of `text`: split at unquoted whitespace; `'...'` keeps everything as it
/// is, `"..."` keeps everything but `\\"` and `\\\\` (a backslash before them is
/// dropped), and outside quotes a backslash keeps the next character. An unclosed
/// quote or a trailing backslash is an error naming it.
pub(crate) fn split(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word has begun: `''` is an empty word, whitespace is none.
    let mut in_word = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => word.push(c),
                        None => return Err(format!("unclosed ' in {text:?}")),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\')) => word.push(c),
                            Some(c) => {
                                word.push('\\');
                                word.push(c);
                            }
                            None => return Err(format!("unclosed \" in {text:?}")),
                        },
                        Some(c) => word.push(c),
                        None => return Err(format!("unclosed \" in {text:?}")),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => word.push(c),
                    None => return Err(format!("a backslash ends {text:?}")),
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::split;

    #[test]
    fn words_split_at_unquoted_whitespace() {
        assert_eq!(split("-F ./cfg").unwrap(), ["-F", "./cfg"]);
        assert_eq!(split("  a\t b  ").unwrap(), ["a", "b"]);
        assert!(split("").unwrap().is_empty());
    }

    #[test]
    fn quotes_keep_spaces_and_each_other() {
        assert_eq!(
            split("--mca plm_rsh_args '-F my cfg'").unwrap(),
            ["--mca", "plm_rsh_args", "-F my cfg"]
        );
        assert_eq!(split(r#"a"b c"d"#).unwrap(), ["ab cd"]);
        assert_eq!(
            split(r#""say \"hi\"" 'it''s'"#).unwrap(),
            ["say \"hi\"", "its"]
        );
        assert_eq!(split(r"a\ b ''").unwrap(), ["a b", ""]);
        assert_eq!(split(r#""\n""#).unwrap(), [r"\n"]);
    }

    #[test]
    fn unclosed_quotes_are_named() {
        assert!(split("'a").unwrap_err().contains("unclosed '"));
        assert!(split("\"a").unwrap_err().contains("unclosed \""));
        assert!(split("a\\").unwrap_err().contains("backslash"));
    }
}
