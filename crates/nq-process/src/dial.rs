//! How a client reaches a coordinator that requires TLS or a token: the
//! `--token`, `--ca`, `--tls-cert` and `--tls-key` flags, the same in
//! `nq-worker` and in `nq-coord`'s client subcommands (`status`, `health`).
//!
//! Both programs flatten [`DialArgs`] into their arguments and turn it,
//! with the `--connect` address, into a [`Dial`]: the address (switched to
//! TLS when any TLS flag is given), the loaded TLS files and the token. The
//! files are read and checked here, so a bad one fails before any
//! connection is tried, with the flag named.

use std::path::PathBuf;
use std::time::Duration;

use nq_proto::address::CoordinatorAddress;
use nq_proto::auth::{Bearer, Token, TokenError};
use nq_proto::tls::{ClientTls, TlsError};

/// The flags that let a client in: `#[command(flatten)]` them into the
/// program's arguments. Every one can be set from its `NQ_*` variable.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct DialArgs {
    /// The coordinator's shared secret (its --token), sent on every call as
    /// `authorization: Bearer TOKEN`. A refused token stops the program
    /// (exit 1). Prefer the environment variable: a command line is visible
    /// to every user of the machine.
    #[arg(long, value_name = "TOKEN", env = "NQ_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Speak TLS to the coordinator, trusting this CA (PEM) for its
    /// certificate. Without it, an https:// coordinator is checked against
    /// the system's CA certificates.
    #[arg(long, value_name = "PEM", env = "NQ_CA")]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for a coordinator that requires one (mutual
    /// TLS: its --tls-client-ca), with --tls-key.
    #[arg(long, value_name = "PEM", env = "NQ_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, RSA or EC).
    #[arg(long, value_name = "PEM", env = "NQ_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// Flags that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// A token that cannot travel as gRPC metadata.
    #[error("invalid --token (or NQ_TOKEN)")]
    Token(#[source] TokenError),
    /// A TLS file that cannot be read or used; the message names its flag.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// tonic refuses the TLS settings for this address.
    #[error("cannot use TLS towards {address}")]
    Endpoint {
        /// The coordinator.
        address: CoordinatorAddress,
        /// What tonic said.
        #[source]
        source: tonic::transport::Error,
    },
}

/// Everything needed to call a coordinator: see [`DialArgs::dial`].
#[derive(Clone, Debug)]
pub struct Dial {
    /// The coordinator, `https://` whenever TLS is spoken.
    pub address: CoordinatorAddress,
    /// The TLS settings; `Some` exactly when [`CoordinatorAddress::tls`] is.
    pub tls: Option<ClientTls>,
    /// Sent on every call as `authorization: Bearer <token>`.
    pub token: Option<Token>,
}

impl DialArgs {
    /// Checks the token and loads the TLS files for `address`. TLS is spoken
    /// when the address is `https://` or `--ca` or `--tls-cert` is given
    /// (any address form then speaks TLS); without `--ca` the system's CA
    /// certificates are trusted.
    ///
    /// # Errors
    ///
    /// [`DialError::Token`] for an unusable token, [`DialError::Tls`] for a
    /// TLS file that cannot be read or used (naming its flag).
    pub fn dial(&self, address: CoordinatorAddress) -> Result<Dial, DialError> {
        let token = self
            .token
            .as_deref()
            .map(Token::new)
            .transpose()
            .map_err(DialError::Token)?;
        let tls = address.tls() || self.ca.is_some() || self.tls_cert.is_some();
        let (address, tls) = if tls {
            let files = ClientTls::load(
                self.ca.as_deref(),
                self.tls_cert.as_deref(),
                self.tls_key.as_deref(),
            )?;
            (address.with_tls(), Some(files))
        } else {
            (address, None)
        };
        Ok(Dial {
            address,
            tls,
            token,
        })
    }
}

impl Dial {
    /// A gRPC endpoint for one short exchange (a subcommand's call), with
    /// `timeout` on connecting and on each call, and TLS when it is spoken.
    ///
    /// # Errors
    ///
    /// [`DialError::Endpoint`] when tonic refuses the TLS settings.
    pub fn endpoint(
        &self,
        timeout: Duration,
    ) -> Result<tonic::transport::Endpoint, DialError> {
        let mut endpoint = self
            .address
            .endpoint()
            .connect_timeout(timeout)
            .timeout(timeout);
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.config()).map_err(|source| {
                DialError::Endpoint {
                    address: self.address.clone(),
                    source,
                }
            })?;
        }
        Ok(endpoint)
    }

    /// The interceptor that sends the token (nothing without one).
    pub fn bearer(&self) -> Bearer {
        Bearer(self.token.clone())
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        dial: DialArgs,
    }

    fn address(s: &str) -> CoordinatorAddress {
        s.parse().unwrap()
    }

    /// Every flag has its `NQ_*` variable, named after the flag.
    #[test]
    fn every_flag_has_its_environment_variable() {
        for arg in Cli::command().get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" {
                continue;
            }
            let env = arg.get_env().and_then(|e| e.to_str());
            assert_eq!(env, Some(&*format!("NQ_{}", id.to_uppercase())), "--{id}");
        }
    }

    #[test]
    fn plain_without_tls_flags_and_the_token_checked() {
        let dial = DialArgs::default().dial(address("coord:7000")).unwrap();
        assert!(dial.tls.is_none() && dial.token.is_none());
        assert_eq!(dial.address.to_string(), "http://coord:7000");
        let endpoint = dial.endpoint(Duration::from_secs(1)).unwrap();
        assert_eq!(endpoint.uri().to_string(), "http://coord:7000/");

        let args = DialArgs {
            token: Some("s3cret".into()),
            ..DialArgs::default()
        };
        assert!(args.dial(address("coord")).unwrap().token.is_some());
        let bad = DialArgs {
            token: Some("has space".into()),
            ..DialArgs::default()
        };
        let err = bad.dial(address("coord")).unwrap_err();
        assert!(matches!(err, DialError::Token(_)), "{err:?}");
        assert!(err.to_string().contains("--token"), "{err}");
    }

    #[test]
    fn an_https_address_speaks_tls() {
        // Without --ca: the system's CA certificates (none may be installed;
        // then loading says so, naming what it tried).
        match DialArgs::default().dial(address("https://coord")) {
            Ok(dial) => {
                assert!(dial.tls.is_some() && dial.address.tls());
                let endpoint = dial.endpoint(Duration::from_secs(1)).unwrap();
                assert_eq!(endpoint.uri().to_string(), "https://coord:50051/");
            }
            Err(e) => assert!(e.to_string().contains("system"), "{e}"),
        }
    }

    #[test]
    fn a_missing_ca_file_is_named_with_its_flag() {
        let args = Cli::try_parse_from(["x", "--ca", "/nonexistent/ca.pem"]).unwrap();
        let err = args.dial.dial(address("coord")).unwrap_err();
        assert!(matches!(err, DialError::Tls(_)), "{err:?}");
        assert!(
            err.to_string().contains("--ca /nonexistent/ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn a_certificate_needs_its_key() {
        let err = Cli::try_parse_from(["x", "--tls-cert", "c.pem"]).unwrap_err();
        assert!(err.to_string().contains("--tls-key"), "{err}");
        let err = Cli::try_parse_from(["x", "--tls-key", "k.pem"]).unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
    }
}
