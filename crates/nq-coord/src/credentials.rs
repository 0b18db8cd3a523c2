//! Who a worker is, for verification: the credential behind its calls.
//!
//! A vote is worth what its identity costs. An address costs nothing (a
//! secondary IPv4 address, or any of the billions in an IPv6 /64), so two
//! liar processes on one machine with two source addresses are two voices
//! when identities are addresses. A credential that the operator hands out,
//! one per machine, costs what the operator makes it cost:
//!
//! - with mutual TLS, the identity is the client certificate (its SHA-256
//!   fingerprint, [`certificate_identity`]);
//! - with per-worker tokens (`--worker-tokens FILE`, [`WorkerTokens`]), the
//!   identity is the name of the token the calls carry;
//! - otherwise the address (or `name@address` on loopback) is the last
//!   fallback.
//!
//! One credential is one voice however many addresses or registrations use
//! it: the scheduler interns the identity string, and every registration
//! under it votes as that one identity.

use std::fmt;
use std::path::Path;

use nq_proto::auth::{Refusal, Token};
use sha2::{Digest, Sha256};

/// The named tokens of a run's machines: one line `NAME TOKEN` per machine.
///
/// Its `Debug` form lists the names only, never a token.
#[derive(Clone, Default)]
pub struct WorkerTokens {
    entries: Vec<(String, Token)>,
}

/// A worker-tokens file that cannot be used, with the line at fault.
#[derive(Debug, thiserror::Error)]
#[error(
    "worker tokens, line {line}: {problem}; each line is `NAME TOKEN` (NAME: 1 to 64 \
     letters, digits, '.', '_' or '-'; TOKEN: visible ASCII without spaces, e.g. \
     `openssl rand -hex 32`), with blank lines and `#` comments allowed"
)]
pub struct WorkerTokensError {
    /// The 1-based line (0: the file as a whole).
    pub line: usize,
    /// What is wrong with it.
    pub problem: String,
}

/// An identity that `--trust` cannot name, with the accepted forms.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot trust {given:?}: name a credential, `token:NAME` (a name in the \
     --worker-tokens file) or `cert:HEX` (the 32 hex digits a worker's client \
     certificate is logged under); an address cannot be trusted, since anyone \
     who can use it would be"
)]
pub struct TrustError {
    /// What was given.
    pub given: String,
}

/// Checks an identity given to `--trust`: a per-worker token's identity
/// (`token:NAME`) or a client certificate's (`cert:` and 32 lowercase hex
/// digits). Addresses are refused: trusting one would hand the deciding vote
/// to whoever can send from it.
///
/// # Errors
///
/// [`TrustError`] for anything else.
pub fn trusted_identity(given: &str) -> Result<String, TrustError> {
    let bad = || TrustError {
        given: given.to_owned(),
    };
    if let Some(name) = given.strip_prefix("token:") {
        let ok = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        return ok.then(|| given.to_owned()).ok_or_else(bad);
    }
    if let Some(hex) = given.strip_prefix("cert:") {
        let ok =
            hex.len() == 32 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'));
        return ok.then(|| given.to_owned()).ok_or_else(bad);
    }
    Err(bad())
}

/// The identity string of a credential-backed caller named `name` in a
/// worker-tokens file.
pub fn token_identity(name: &str) -> String {
    format!("token:{name}")
}

/// The identity string of a caller that presented the client certificate
/// `der` (mutual TLS): the first 128 bits of its SHA-256 fingerprint, enough
/// to tell any two certificates apart and short enough to read in a log.
pub fn certificate_identity(der: &[u8]) -> String {
    let digest = Sha256::digest(der);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("cert:{hex}")
}

impl WorkerTokens {
    /// Parses the text of a worker-tokens file.
    ///
    /// # Errors
    ///
    /// [`WorkerTokensError`] for a malformed line, a bad name or token, a
    /// name or token listed twice, or a file without any entry.
    pub fn parse(text: &str) -> Result<WorkerTokens, WorkerTokensError> {
        let mut entries: Vec<(String, Token)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let fail = |problem: String| WorkerTokensError { line, problem };
            let content = raw.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let mut fields = content.split_whitespace();
            let (Some(name), Some(token), None) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(fail("expected two fields".into()));
            };
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(fail(format!("{name:?} is not a valid name")));
            }
            let token = Token::new(token).map_err(|e| fail(e.to_string()))?;
            if entries.iter().any(|(n, _)| n == name) {
                return Err(fail(format!("the name {name:?} is listed twice")));
            }
            if entries.iter().any(|(_, t)| *t == token) {
                // Two names for one secret would be one machine with two
                // voices: the very thing a credential is there to prevent.
                return Err(fail("this token is already given to another name".into()));
            }
            entries.push((name.to_owned(), token));
        }
        if entries.is_empty() {
            return Err(WorkerTokensError {
                line: 0,
                problem: "the file lists no token".into(),
            });
        }
        Ok(WorkerTokens { entries })
    }

    /// Reads and parses a worker-tokens file.
    ///
    /// # Errors
    ///
    /// [`WorkerTokensError`] naming the unreadable file or the bad line.
    pub fn load(path: &Path) -> Result<WorkerTokens, WorkerTokensError> {
        let text = std::fs::read_to_string(path).map_err(|e| WorkerTokensError {
            line: 0,
            problem: format!("cannot read {}: {e}", path.display()),
        })?;
        WorkerTokens::parse(&text)
    }

    /// How many machines the file names.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Never true for a parsed file.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The name of the token that a call's `authorization` metadata carries.
    /// Each entry is checked by [`Token::check`] (constant time), and all of
    /// them are checked, so that the time taken does not say which one
    /// matched.
    ///
    /// # Errors
    ///
    /// Why none matched: the token was missing, malformed or not one of
    /// these.
    pub fn name_of(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<&str, Refusal> {
        let mut found = Err(Refusal::Missing);
        for (name, token) in &self.entries {
            match token.check(metadata) {
                Ok(()) => found = Ok(name.as_str()),
                Err(refusal) if found.is_err() => found = Err(refusal),
                Err(_) => {}
            }
        }
        found
    }
}

impl fmt::Debug for WorkerTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|(n, _)| n))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: &str) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert(nq_proto::auth::AUTHORIZATION, header.parse().unwrap());
        m
    }

    #[test]
    fn a_token_names_its_machine_and_nothing_else_does() {
        let book = WorkerTokens::parse(
            "# machines of the run\nrack1-a  s3cret-a\n\nrack1-b s3cret-b # spare\n",
        )
        .unwrap();
        assert_eq!(book.len(), 2);
        assert_eq!(book.name_of(&with("Bearer s3cret-a")), Ok("rack1-a"));
        assert_eq!(book.name_of(&with("Bearer s3cret-b")), Ok("rack1-b"));
        assert_eq!(book.name_of(&with("Bearer s3cret-c")), Err(Refusal::Wrong));
        assert_eq!(book.name_of(&with("Bearer s3cret-a ")), Err(Refusal::Wrong));
        assert_eq!(
            book.name_of(&with("Basic s3cret-a")),
            Err(Refusal::Malformed)
        );
        assert_eq!(
            book.name_of(&tonic::metadata::MetadataMap::new()),
            Err(Refusal::Missing)
        );
        assert!(!format!("{book:?}").contains("s3cret"), "{book:?}");
        assert_eq!(token_identity("rack1-a"), "token:rack1-a");
    }

    #[test]
    fn bad_files_name_the_line_and_the_accepted_form() {
        for (text, line, needle) in [
            ("a", 1, "two fields"),
            ("a b c", 1, "two fields"),
            ("ok t1\nb@d t2", 2, "not a valid name"),
            ("a t1\na t2", 2, "listed twice"),
            ("a t1\nb t1", 2, "another name"),
            ("# nothing\n\n", 0, "no token"),
        ] {
            let e = WorkerTokens::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            let message = e.to_string();
            assert!(message.contains(needle), "{text:?}: {message}");
            assert!(message.contains("NAME TOKEN"), "{message}");
        }
    }

    #[test]
    fn a_certificate_identity_is_its_fingerprint() {
        let a = certificate_identity(b"certificate a");
        assert!(a.starts_with("cert:") && a.len() == 5 + 32, "{a}");
        assert_eq!(a, certificate_identity(b"certificate a"));
        assert_ne!(a, certificate_identity(b"certificate b"));
    }

    #[test]
    fn only_credentials_can_be_trusted() {
        assert_eq!(trusted_identity("token:box-1").unwrap(), "token:box-1");
        let cert = format!("cert:{}", "ab".repeat(16));
        assert_eq!(trusted_identity(&cert).unwrap(), cert);
        for bad in [
            "10.0.0.7",
            "token:",
            "token:a b",
            "cert:AB",
            "cert:abc",
            "local",
            "w@127.0.0.1",
        ] {
            let e = trusted_identity(bad).unwrap_err().to_string();
            assert!(e.contains("token:NAME") && e.contains(bad), "{bad}: {e}");
        }
    }
}
