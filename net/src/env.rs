//! Environment variables, read through a [`Lookup`] and checked by typed readers.
//!
//! Every switchyard crate reads its variables here, so that one rule holds
//! everywhere:
//!
//! - a value that is empty or only whitespace counts as unset (as `VAR= program`
//!   does in a shell), and surrounding whitespace is ignored;
//! - a value that is set but malformed is an [`EnvError`] naming the variable, the
//!   value and what was expected, never a warning followed by a default.
//!
//! A reader takes any [`Lookup`]: [`ProcessEnv`] in a program, a map, a slice of
//! pairs or a closure in a test, which then needs no `std::env::set_var` and no
//! child process.
//!
//! ```
//! use std::time::Duration;
//! use switchyard_net::env;
//! let vars = [("APP_WAIT_MS", "250"), ("APP_MODE", "fast"), ("APP_N", "lots")];
//! assert_eq!(env::millis(&vars, "APP_WAIT_MS"), Ok(Some(Duration::from_millis(250))));
//! assert_eq!(env::one_of(&vars, "APP_MODE", &[("fast", 1), ("slow", 2)]), Ok(Some(1)));
//! assert_eq!(env::u32(&vars, "APP_UNSET"), Ok(None));
//! let err = env::u32(&vars, "APP_N").unwrap_err();
//! assert_eq!(err.to_string(), r#"APP_N="lots": expected a non-negative integer"#);
//! ```

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;
use std::str::FromStr;
use std::time::Duration;

/// Where variables come from: the process environment ([`ProcessEnv`]), or a map,
/// a slice of `(name, value)` pairs or a closure `Fn(&str) -> Option<String>`.
pub trait Lookup {
    /// The raw value of `name`, `None` when it is not set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The environment of this process.
///
/// A value that is not UTF-8 is returned lossily converted, so that it is reported
/// as malformed rather than mistaken for an unset variable.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Lookup for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
}

impl<F: Fn(&str) -> Option<String>> Lookup for F {
    fn get(&self, name: &str) -> Option<String> {
        self(name)
    }
}

impl<S: BuildHasher> Lookup for HashMap<String, String, S> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).cloned()
    }
}

impl<S: BuildHasher> Lookup for HashMap<&str, &str, S> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).map(|v| v.to_string())
    }
}

impl Lookup for BTreeMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).cloned()
    }
}

impl Lookup for [(&str, &str)] {
    fn get(&self, name: &str) -> Option<String> {
        // The last pair wins, as the last assignment does in a shell.
        self.iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())
    }
}

impl<const N: usize> Lookup for [(&str, &str); N] {
    fn get(&self, name: &str) -> Option<String> {
        Lookup::get(self.as_slice(), name)
    }
}

impl Lookup for Vec<(String, String)> {
    fn get(&self, name: &str) -> Option<String> {
        self.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// A variable that is missing where it is needed, or set to a value that does not
/// mean what it should: names the variable, its value and what was expected.
///
/// Reads as `SWITCHYARD_HEARTBEAT_MS="abc": expected a whole number of milliseconds`,
/// or `MASTER_PORT is unset: expected ...` for a missing one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvError {
    var: String,
    value: Option<String>,
    expected: String,
}

impl EnvError {
    /// `var` is set to `value`, which is not `expected` (a phrase such as "a
    /// non-negative integer").
    pub fn malformed(
        var: impl Into<String>,
        value: impl Into<String>,
        expected: impl Into<String>,
    ) -> EnvError {
        EnvError {
            var: var.into(),
            value: Some(value.into()),
            expected: expected.into(),
        }
    }

    /// `var` is unset (or empty) where `expected` says what it should have held and
    /// why it is needed.
    pub fn missing(var: impl Into<String>, expected: impl Into<String>) -> EnvError {
        EnvError {
            var: var.into(),
            value: None,
            expected: expected.into(),
        }
    }

    /// The variable.
    pub fn var(&self) -> &str {
        &self.var
    }

    /// Its value as read, `None` when it was unset.
    pub fn value(&self) -> Option<&str> {
        self.value.as_deref()
    }

    /// What a good value would have been.
    pub fn expected(&self) -> &str {
        &self.expected
    }
}

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{}={value:?}: expected {}", self.var, self.expected),
            None => write!(f, "{} is unset: expected {}", self.var, self.expected),
        }
    }
}

impl std::error::Error for EnvError {}

/// The value of `var`, trimmed; `None` when unset, empty or only whitespace.
pub fn text(lookup: &(impl Lookup + ?Sized), var: &str) -> Option<String> {
    let value = lookup.get(var)?;
    let trimmed = value.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_string())
}

/// The value of `var` ([`text`]), which must be set: otherwise an error saying
/// `expected`.
pub fn required(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
    expected: &str,
) -> Result<String, EnvError> {
    text(lookup, var).ok_or_else(|| EnvError::missing(var, expected))
}

/// `var` parsed as a `T`; `expected` words the error for a value that does not
/// parse.
pub fn parse<T: FromStr>(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
    expected: &str,
) -> Result<Option<T>, EnvError> {
    parse_with(lookup, var, expected, |s| s.parse().ok())
}

/// `var` through `convert`, whose `None` is a malformed value: the error says
/// `expected`.
pub fn parse_with<T>(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
    expected: &str,
    convert: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, EnvError> {
    match text(lookup, var) {
        None => Ok(None),
        Some(value) => match convert(&value) {
            Some(v) => Ok(Some(v)),
            None => Err(EnvError::malformed(var, value, expected)),
        },
    }
}

/// The words of every integer reader's error.
pub const INTEGER: &str = "a non-negative integer";

/// `var` as a `u32`.
pub fn u32(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<u32>, EnvError> {
    parse(lookup, var, INTEGER)
}

/// `var` as a `u64`.
pub fn u64(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<u64>, EnvError> {
    parse(lookup, var, INTEGER)
}

/// `var` as a `usize` (a count or a number of bytes).
pub fn usize(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<usize>, EnvError> {
    parse(lookup, var, INTEGER)
}

/// `var` as a TCP port, 1 to 65535 (port 0 would mean "any" to a listener, never
/// the address of a peer).
pub fn port(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<u16>, EnvError> {
    parse_with(lookup, var, "a port number (1..65535)", |s| {
        s.parse::<u16>().ok().filter(|&p| p != 0)
    })
}

/// `var` as whole milliseconds.
pub fn millis(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<Duration>, EnvError> {
    parse_with(lookup, var, "a whole number of milliseconds", |s| {
        s.parse().ok().map(Duration::from_millis)
    })
}

/// `var` as whole microseconds.
pub fn micros(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<Duration>, EnvError> {
    parse_with(lookup, var, "a whole number of microseconds", |s| {
        s.parse().ok().map(Duration::from_micros)
    })
}

/// `var` as seconds, fractions allowed (`0.5`); zero included.
pub fn seconds(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<Duration>, EnvError> {
    parse_with(
        lookup,
        var,
        "a number of seconds (fractions allowed)",
        |s| {
            s.parse()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
        },
    )
}

/// `var` as seconds, fractions allowed, above zero.
pub fn positive_seconds(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
) -> Result<Option<Duration>, EnvError> {
    parse_with(
        lookup,
        var,
        "a positive number of seconds (fractions allowed)",
        |s| {
            s.parse()
                .ok()
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| !d.is_zero())
        },
    )
}

/// `var` as a switch: `1` or `true` on, `0` or `false` off.
pub fn flag(lookup: &(impl Lookup + ?Sized), var: &str) -> Result<Option<bool>, EnvError> {
    one_of(
        lookup,
        var,
        &[("1", true), ("0", false), ("true", true), ("false", false)],
    )
}

/// `var` as one of `choices` (`(text, value)` pairs, matched exactly); the error
/// lists the texts.
pub fn one_of<T: Copy>(
    lookup: &(impl Lookup + ?Sized),
    var: &str,
    choices: &[(&str, T)],
) -> Result<Option<T>, EnvError> {
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let expected = match names.as_slice() {
        [] => "nothing (no value is accepted)".to_string(),
        [one] => one.to_string(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    };
    parse_with(lookup, var, &expected, |s| {
        choices.iter().find(|(name, _)| *name == s).map(|&(_, v)| v)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_kind_of_lookup_answers() {
        let pairs = [("A", "1"), ("A", "2")];
        assert_eq!(Lookup::get(&pairs, "A").as_deref(), Some("2"));
        assert_eq!(Lookup::get(pairs.as_slice(), "B"), None);
        let map: HashMap<String, String> = [("A".to_string(), "x".to_string())].into();
        assert_eq!(Lookup::get(&map, "A").as_deref(), Some("x"));
        let tree: BTreeMap<String, String> = [("A".to_string(), "y".to_string())].into();
        assert_eq!(Lookup::get(&tree, "A").as_deref(), Some("y"));
        let closure = |name: &str| (name == "A").then(|| "z".to_string());
        assert_eq!(text(&closure, "A").as_deref(), Some("z"));
        let owned = vec![("A".to_string(), "w".to_string())];
        assert_eq!(text(&owned, "A").as_deref(), Some("w"));
        // The process environment has PATH on every test machine.
        assert!(ProcessEnv.get("PATH").is_some());
    }

    #[test]
    fn blank_is_unset_and_values_are_trimmed() {
        let vars = [("E", ""), ("W", "  "), ("N", " 7 ")];
        assert_eq!(u32(&vars, "E"), Ok(None));
        assert_eq!(u32(&vars, "W"), Ok(None));
        assert_eq!(u32(&vars, "N"), Ok(Some(7)));
        assert_eq!(
            required(&vars, "E", "a host name").unwrap_err().to_string(),
            "E is unset: expected a host name"
        );
    }

    #[test]
    fn each_reader_names_the_variable_the_value_and_what_it_wanted() {
        let vars = [
            ("N", "-3"),
            ("P", "0"),
            ("MS", "1.5"),
            ("US", "x"),
            ("S", "-1"),
            ("PS", "0"),
            ("F", "yes"),
            ("O", "udp"),
        ];
        let cases: Vec<(EnvError, &str)> = vec![
            (
                u32(&vars, "N").unwrap_err(),
                r#"N="-3": expected a non-negative integer"#,
            ),
            (
                u64(&vars, "N").unwrap_err(),
                r#"N="-3": expected a non-negative integer"#,
            ),
            (
                usize(&vars, "N").unwrap_err(),
                r#"N="-3": expected a non-negative integer"#,
            ),
            (
                port(&vars, "P").unwrap_err(),
                r#"P="0": expected a port number (1..65535)"#,
            ),
            (
                millis(&vars, "MS").unwrap_err(),
                r#"MS="1.5": expected a whole number of milliseconds"#,
            ),
            (
                micros(&vars, "US").unwrap_err(),
                r#"US="x": expected a whole number of microseconds"#,
            ),
            (
                seconds(&vars, "S").unwrap_err(),
                r#"S="-1": expected a number of seconds (fractions allowed)"#,
            ),
            (
                positive_seconds(&vars, "PS").unwrap_err(),
                r#"PS="0": expected a positive number of seconds (fractions allowed)"#,
            ),
            (
                flag(&vars, "F").unwrap_err(),
                r#"F="yes": expected 1, 0, true or false"#,
            ),
            (
                one_of(&vars, "O", &[("tcp", 0), ("zmq", 1)]).unwrap_err(),
                r#"O="udp": expected tcp or zmq"#,
            ),
        ];
        for (err, display) in cases {
            assert_eq!(err.to_string(), display);
            assert!(err.value().is_some());
        }
        let err = u32(&vars, "N").unwrap_err();
        assert_eq!(
            (err.var(), err.value(), err.expected()),
            ("N", Some("-3"), INTEGER)
        );
    }

    #[test]
    fn good_values_read() {
        let vars = [
            ("P", "65535"),
            ("S", "0.25"),
            ("F", "true"),
            ("Z", "0"),
            ("B", "1048576"),
        ];
        assert_eq!(port(&vars, "P"), Ok(Some(65535)));
        assert_eq!(seconds(&vars, "S"), Ok(Some(Duration::from_millis(250))));
        assert_eq!(seconds(&vars, "Z"), Ok(Some(Duration::ZERO)));
        assert_eq!(flag(&vars, "F"), Ok(Some(true)));
        assert_eq!(flag(&vars, "Z"), Ok(Some(false)));
        assert_eq!(usize(&vars, "B"), Ok(Some(1 << 20)));
        assert_eq!(micros(&vars, "Z"), Ok(Some(Duration::ZERO)));
    }
}
