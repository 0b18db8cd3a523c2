//! The shared token: how a worker presents it and how a coordinator checks it.
//!
//! The token travels as the standard `authorization: Bearer <token>` metadata,
//! so that generic gRPC tools (`grpcurl -H 'authorization: Bearer …'`) can use
//! it too. Both ends take it from `--token` or the `NQ_TOKEN` environment
//! variable.
//!
//! The check compares in constant time ([`subtle`]): how long a refusal takes
//! does not depend on how many leading bytes of a guess were right, so a
//! stranger cannot recover the token byte by byte from response times. (The
//! token's length is not secret: the comparison may end early when the
//! lengths differ.)
//!
//! This module only decides; logging a refusal, with the peer's address, is
//! the coordinator's business.

use std::fmt;

use subtle::ConstantTimeEq;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};

/// The metadata key that carries the token (lower case, as gRPC requires).
pub const AUTHORIZATION: &str = "authorization";

/// The scheme in front of the token in [`AUTHORIZATION`].
const BEARER: &str = "Bearer ";

/// What a refused caller is told to do, in every UNAUTHENTICATED status.
pub const HOW_TO_AUTHENTICATE: &str =
    "send `authorization: Bearer <token>`; set --token or NQ_TOKEN";

/// The metadata key on a refusal that tells a worker which rule refused it,
/// so that it can explain the refusal without parsing the message.
pub const REFUSAL: &str = "nq-refusal";

/// The [`REFUSAL`] value of a call refused by protected mode: the
/// coordinator has neither a token nor TLS, and the caller is not on its own
/// machine.
pub const LOOPBACK_ONLY: &str = "loopback-only";

/// What a caller refused by protected mode is told: why, and the three ways
/// to open the run to other machines.
pub const HOW_TO_OPEN: &str = "this coordinator has neither a token nor TLS, so it \
     serves workers on its own machine only (protected mode); to let other machines \
     join, set the same NQ_TOKEN (or --token) on the coordinator and on every worker, \
     or serve TLS (--tls-cert and --tls-key on the coordinator; https:// and --ca on \
     the workers), or start the coordinator with --insecure-open-port \
     (NQ_INSECURE_OPEN_PORT=1) to let anyone who reaches its port join";

/// The status of a call refused by protected mode: UNAUTHENTICATED, with
/// [`HOW_TO_OPEN`] as its message and [`REFUSAL`]` = `[`LOOPBACK_ONLY`] in
/// its metadata.
///
/// UNAUTHENTICATED rather than PERMISSION_DENIED: the caller is refused
/// because it cannot prove who it is (the coordinator has no credential to
/// check), and the remedy is a credential (a token or TLS). gRPC's status
/// guide keeps PERMISSION_DENIED for callers that were identified and are
/// not allowed, which is what a banned worker gets; a worker treats that as
/// a verdict on itself, and UNAUTHENTICATED as a configuration error.
pub fn loopback_only_status() -> tonic::Status {
    let mut status = tonic::Status::unauthenticated(HOW_TO_OPEN);
    status
        .metadata_mut()
        .insert(REFUSAL, AsciiMetadataValue::from_static(LOOPBACK_ONLY));
    status
}

/// True when `status` is a refusal by protected mode
/// ([`loopback_only_status`]).
pub fn is_loopback_only(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unauthenticated
        && status
            .metadata()
            .get(REFUSAL)
            .is_some_and(|v| v.as_encoded_bytes() == LOOPBACK_ONLY.as_bytes())
}

/// A shared secret that every call of the coordinator's service must carry.
///
/// Its `Debug` form hides the value, so that it never reaches a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

/// A token that cannot be sent as gRPC metadata.
#[derive(Debug, thiserror::Error)]
#[error(
    "the token is {reason}; use 1 to 4096 visible ASCII characters without spaces \
     (e.g. the output of `openssl rand -hex 32`)"
)]
pub struct TokenError {
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Token {
    /// Checks that `token` can travel in a metadata value: 1 to 4096 visible
    /// ASCII characters, no spaces.
    ///
    /// # Errors
    ///
    /// [`TokenError`] naming the problem and the accepted form.
    pub fn new(token: impl Into<String>) -> Result<Token, TokenError> {
        let token = token.into();
        let reason = if token.is_empty() {
            Some("empty")
        } else if token.len() > 4096 {
            Some("longer than 4096 characters")
        } else if !token.bytes().all(|b| b.is_ascii_graphic()) {
            Some("not made of visible ASCII characters only")
        } else {
            None
        };
        match reason {
            Some(reason) => Err(TokenError { reason }),
            None => Ok(Token(token)),
        }
    }

    /// The value of the [`AUTHORIZATION`] metadata: `Bearer <token>`.
    pub fn header_value(&self) -> AsciiMetadataValue {
        format!("{BEARER}{}", self.0)
            .parse()
            .expect("a Token is visible ASCII, which is a valid metadata value")
    }

    /// Checks the [`AUTHORIZATION`] metadata of a call.
    ///
    /// # Errors
    ///
    /// [`Refusal`] saying whether the token was missing, malformed or wrong.
    pub fn check(&self, metadata: &MetadataMap) -> Result<(), Refusal> {
        let mut values = metadata.get_all(AUTHORIZATION).iter();
        let value = values.next().ok_or(Refusal::Missing)?;
        // Two tokens are one too many: which one would count is a guess.
        if values.next().is_some() {
            return Err(Refusal::Malformed);
        }
        let value = value.as_encoded_bytes();
        let presented = match value.split_at_checked(BEARER.len()) {
            // The scheme is case-insensitive (RFC 9110, section 11.1).
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case(BEARER.as_bytes()) => {
                rest
            }
            _ => return Err(Refusal::Malformed),
        };
        if bool::from(presented.ct_eq(self.0.as_bytes())) {
            Ok(())
        } else {
            Err(Refusal::Wrong)
        }
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// Why a call was refused by [`Token::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No `authorization` metadata.
    Missing,
    /// `authorization` is not one `Bearer <token>` value.
    Malformed,
    /// A `Bearer` token that is not the coordinator's.
    Wrong,
}

impl Refusal {
    /// A short description for logs and statuses.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Missing => "no token",
            Refusal::Malformed => "a malformed authorization header",
            Refusal::Wrong => "a wrong token",
        }
    }

    /// The UNAUTHENTICATED status a refused call gets. It says what was wrong
    /// and what to send, never what the token is.
    pub fn status(self) -> tonic::Status {
        tonic::Status::unauthenticated(format!(
            "this coordinator requires a token and the call carried {}: {HOW_TO_AUTHENTICATE}",
            self.as_str()
        ))
    }
}

/// A client interceptor that adds `authorization: Bearer <token>` to every
/// call; with `None` it adds nothing (a coordinator without a token).
#[derive(Clone, Debug, Default)]
pub struct Bearer(pub Option<Token>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, token.header_value());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    fn with(values: &[&str]) -> MetadataMap {
        let mut m = MetadataMap::new();
        for v in values {
            m.append(AUTHORIZATION, v.parse().unwrap());
        }
        m
    }

    #[test]
    fn the_right_token_passes_and_every_other_is_refused() {
        let t = Token::new("s3cret").unwrap();
        assert_eq!(t.check(&with(&["Bearer s3cret"])), Ok(()));
        assert_eq!(t.check(&with(&["bearer s3cret"])), Ok(()));
        assert_eq!(t.check(&with(&[])), Err(Refusal::Missing));
        assert_eq!(t.check(&with(&["Bearer s3cres"])), Err(Refusal::Wrong));
        assert_eq!(t.check(&with(&["Bearer s3cret2"])), Err(Refusal::Wrong));
        assert_eq!(t.check(&with(&["Bearer "])), Err(Refusal::Wrong));
        assert_eq!(t.check(&with(&["s3cret"])), Err(Refusal::Malformed));
        assert_eq!(t.check(&with(&["Basic s3cret"])), Err(Refusal::Malformed));
        assert_eq!(
            t.check(&with(&["Bearer s3cret", "Bearer s3cret"])),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn the_interceptor_sends_what_the_check_accepts() {
        let t = Token::new("abc-123_XYZ").unwrap();
        let request = Bearer(Some(t.clone()))
            .call(tonic::Request::new(()))
            .unwrap();
        assert_eq!(t.check(request.metadata()), Ok(()));
        let bare = Bearer(None).call(tonic::Request::new(())).unwrap();
        assert_eq!(t.check(bare.metadata()), Err(Refusal::Missing));
    }

    #[test]
    fn protected_mode_refusals_are_told_apart_from_token_refusals() {
        let status = loopback_only_status();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(
            status.message().contains("--insecure-open-port"),
            "{status:?}"
        );
        assert!(status.message().contains("NQ_TOKEN"), "{status:?}");
        assert!(is_loopback_only(&status));
        assert!(!is_loopback_only(&Refusal::Missing.status()));
        // Through the wire form, as a worker receives it.
        let response = status.into_http::<()>();
        let back = tonic::Status::from_header_map(response.headers())
            .expect("a status in the headers");
        assert!(is_loopback_only(&back), "{back:?}");
    }

    #[test]
    fn bad_tokens_name_the_accepted_form_and_values_stay_hidden() {
        for bad in ["", "two words", "tab\there", "é"] {
            let msg = Token::new(bad).unwrap_err().to_string();
            assert!(msg.contains("visible ASCII"), "{bad:?}: {msg}");
        }
        assert!(Token::new("x".repeat(4097)).is_err());
        let t = Token::new("hunter2").unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
        let status = Refusal::Wrong.status();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains(HOW_TO_AUTHENTICATE));
    }
}
