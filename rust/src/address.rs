//! A broker's addresses: its primary's, then its standbys' (docs/scaling.md, "Standby").
//!
//! Given as the Python client takes them: one string (`"tcp://a:5555"`), one string with commas
//! (`"tcp://a:5555,tcp://b:5555"`), or a list of such strings. They are kept in the order given,
//! without repeats; one DEALER connects to all of them, and only the broker that serves (the one
//! holding the data_dir's lock) ever accepts the connection.

use crate::error::{Error, Result};

/// What [`connect`](crate::connect) and [`Worker::new`](crate::Worker::new) take as the broker's
/// address: a `&str` or `String` (with commas between several addresses, if need be), or a
/// `Vec`, slice or array of them.
pub trait Addresses {
    /// The strings as given, before they are split at commas.
    fn into_strings(self) -> Vec<String>;
}

impl Addresses for &str {
    fn into_strings(self) -> Vec<String> {
        vec![self.to_string()]
    }
}

impl Addresses for String {
    fn into_strings(self) -> Vec<String> {
        vec![self]
    }
}

impl Addresses for &String {
    fn into_strings(self) -> Vec<String> {
        vec![self.clone()]
    }
}

impl<S: AsRef<str>> Addresses for Vec<S> {
    fn into_strings(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}

impl<S: AsRef<str>> Addresses for &[S] {
    fn into_strings(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}

impl<S: AsRef<str>, const N: usize> Addresses for [S; N] {
    fn into_strings(self) -> Vec<String> {
        self.iter().map(|s| s.as_ref().to_string()).collect()
    }
}

/// One broker's addresses, in the order given and without repeats, split at commas and trimmed;
/// `InvalidArgument` naming `what` when none is left.
pub(crate) fn parse(given: &[String], what: &str) -> Result<Vec<String>> {
    let mut addresses: Vec<String> = Vec::new();
    for item in given {
        for address in item.split(',').map(str::trim) {
            if !address.is_empty() && !addresses.iter().any(|a| a == address) {
                addresses.push(address.to_string());
            }
        }
    }
    if addresses.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{what}: expected at least one address such as 'tcp://127.0.0.1:5555', got {given:?}"
        )));
    }
    Ok(addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIMARY: &str = "tcp://127.0.0.1:5555";
    const STANDBY: &str = "tcp://127.0.0.1:6555";

    #[test]
    fn commas_and_lists_give_the_same_addresses_in_order_without_repeats() {
        let both = vec![PRIMARY.to_string(), STANDBY.to_string()];
        assert_eq!(parse(&format!("{PRIMARY}, {STANDBY}").into_strings(), "broker address").unwrap(), both);
        assert_eq!(parse(&[PRIMARY, &format!("{STANDBY},{PRIMARY}")].into_strings(), "broker address").unwrap(), both);
        for bad in [vec![], vec!["".to_string()], vec![" , ".to_string()]] {
            let error = parse(&bad, "broker address").unwrap_err();
            assert!(matches!(&error, Error::InvalidArgument(m) if m.starts_with("broker address")), "{error:?}");
        }
    }
}
