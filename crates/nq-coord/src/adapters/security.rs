//! Who may talk to the coordinator: the check on every call of the
//! `nqueens.v1.Coordinator` service, and what the coordinator says at start
//! about who can reach it.
//!
//! # Protected by default
//!
//! Redis's protected mode is the model. A coordinator started with neither a
//! token nor TLS serves callers on its own machine (loopback peers) only, and
//! refuses every other caller with a status that says how to open the run
//! ([`nq_proto::auth::loopback_only_status`]): set the same token on both
//! sides, serve TLS, or pass `--insecure-open-port`, whose name says what it
//! does. So the one-machine run needs no set-up and exposes nothing, and a
//! two-machine run is two commands plus one shared token.
//!
//! | token | TLS | `--insecure-open-port` | who may call                   |
//! |-------|-----|------------------------|--------------------------------|
//! | set   | any | any                    | callers with the token         |
//! | -     | set | any                    | anyone who completes TLS       |
//! | -     | -   | set                    | anyone                         |
//! | -     | -   | -                      | loopback peers only            |
//!
//! TLS without a token admits every client that completes the handshake;
//! only `--tls-client-ca` (mutual TLS) makes TLS decide who the caller is.
//!
//! The token's format and its constant-time comparison live in
//! [`nq_proto::auth`], shared with the worker; this module adds what only the
//! server does: refusing the call and logging the peer.
//!
//! # One machine
//!
//! A worker on the coordinator's own machine (a loopback peer) whose calls
//! carry the run's shared token is the operator's: it votes as
//! [`crate::core::quorum::LOCAL`], one voice with the coordinator's own
//! threads, trusted like them. So the README's two-command cluster tried on
//! one machine is one machine, and completes as the coordinator alone does.
//! A loopback address alone proves nothing (on a login node any local user
//! can connect to 127.0.0.1): without the token a loopback worker stays an
//! ordinary identity (`name@127.0.0.1`), and a per-machine token
//! (`--worker-tokens`) names its own identity wherever it calls from.
//!
//! The health and reflection services are not wrapped, in any mode: container
//! probes and `grpcurl list` work from anywhere without a token, and neither
//! reveals or changes anything of the run (health says SERVING or
//! NOT_SERVING; reflection describes the public proto). The Status rpc, which
//! names the workers, is part of the coordinator's service and is checked.

use std::net::SocketAddr;
use std::sync::Arc;

use nq_proto::auth::Token;
use tonic::{Request, Status};
use tracing::{info, warn};

use crate::credentials::{WorkerTokens, token_identity};

/// Who may call the coordinator's service: the rule chosen at start from the
/// token, TLS and `--insecure-open-port` (see the module docs).
#[derive(Clone, Debug)]
pub(crate) enum Admission {
    /// Every call must carry this token.
    Token(Arc<Token>),
    /// Every caller passes: TLS guards the port, or the operator opened it
    /// with `--insecure-open-port`.
    Anyone,
    /// Protected mode: only callers on this machine pass.
    LoopbackOnly,
}

impl Admission {
    /// The rule for a coordinator with these settings.
    pub(crate) fn new(
        token: Option<Token>,
        tls: bool,
        insecure_open_port: bool,
    ) -> Admission {
        match token {
            Some(token) => Admission::Token(Arc::new(token)),
            None if tls || insecure_open_port => Admission::Anyone,
            None => Admission::LoopbackOnly,
        }
    }
}

/// The server interceptor that applies an [`Admission`] to every call, and
/// admits the holders of per-machine tokens ([`WorkerTokens`]), noting
/// their [`Credential`] on the call.
#[derive(Clone, Debug)]
pub(crate) struct CallerCheck {
    admission: Admission,
    tokens: Option<Arc<WorkerTokens>>,
}

/// The credential a call was admitted with (the identity string of
/// [`crate::credentials`]), for the handler that registers its worker.
#[derive(Clone, Debug)]
pub(crate) struct Credential(pub(crate) String);

impl CallerCheck {
    pub(crate) fn new(admission: Admission) -> CallerCheck {
        CallerCheck {
            admission,
            tokens: None,
        }
    }

    /// Also admits calls carrying one of `tokens`; with them, a call that
    /// carries none of them needs the run's shared token.
    pub(crate) fn with_worker_tokens(
        mut self,
        tokens: Option<Arc<WorkerTokens>>,
    ) -> Self {
        self.tokens = tokens;
        self
    }
}

/// True for a caller on this machine. `to_canonical` reads
/// `::ffff:127.0.0.1`, which a dual-stack listener reports for an IPv4
/// loopback peer, as the loopback address it is; an unknown address is not
/// loopback.
fn is_loopback(request: &Request<()>) -> bool {
    request
        .remote_addr()
        .is_some_and(|a| a.ip().to_canonical().is_loopback())
}

/// The caller's address, for logs.
fn peer_of(request: &Request<()>) -> String {
    request
        .remote_addr()
        .map_or_else(|| "unknown".to_owned(), |a| a.to_string())
}

impl tonic::service::Interceptor for CallerCheck {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(tokens) = &self.tokens {
            let named = tokens.name_of(request.metadata()).map(token_identity);
            match named {
                Ok(identity) => {
                    request.extensions_mut().insert(Credential(identity));
                    return Ok(request);
                }
                // The run's shared token may still admit it, below.
                Err(_) if matches!(self.admission, Admission::Token(_)) => {}
                Err(refusal) => {
                    warn!(
                        peer = %peer_of(&request),
                        reason = refusal.as_str(),
                        "refused a call: this coordinator requires a worker token"
                    );
                    return Err(refusal.status());
                }
            }
        }
        match &self.admission {
            Admission::Anyone => Ok(request),
            Admission::LoopbackOnly => {
                // A peer whose address is unknown is refused: protected mode
                // fails closed.
                if is_loopback(&request) {
                    return Ok(request);
                }
                warn!(
                    peer = %peer_of(&request),
                    "refused a call from another machine: without a token or TLS this \
                     coordinator serves its own machine only (see --insecure-open-port)"
                );
                Err(nq_proto::auth::loopback_only_status())
            }
            Admission::Token(token) => match token.check(request.metadata()) {
                Ok(()) => {
                    // The operator's own machine: a caller on loopback that
                    // holds the run's token is the operator's (see
                    // "One machine" in the module doc), one voice with the
                    // coordinator's threads.
                    if is_loopback(&request) {
                        request
                            .extensions_mut()
                            .insert(Credential(crate::core::quorum::LOCAL.to_owned()));
                    }
                    Ok(request)
                }
                Err(refusal) => {
                    warn!(
                        peer = %peer_of(&request),
                        reason = refusal.as_str(),
                        "refused a call: this coordinator requires a token"
                    );
                    Err(refusal.status())
                }
            },
        }
    }
}

/// How open a listening address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Loopback only, or protected by TLS.
    Guarded,
    /// Beyond loopback with neither token nor TLS, in protected mode: other
    /// machines reach the port and are refused.
    Protected,
    /// Beyond loopback with a token but no TLS: the token crosses the
    /// network in clear text.
    ClearToken,
    /// Beyond loopback with neither token nor TLS, opened with
    /// `--insecure-open-port`: anyone who reaches the port can register and
    /// report counts.
    Open,
}

impl Exposure {
    pub(crate) fn of(addr: SocketAddr, admission: &Admission, tls: bool) -> Exposure {
        if addr.ip().to_canonical().is_loopback() || tls {
            return Exposure::Guarded;
        }
        match admission {
            Admission::Token(_) => Exposure::ClearToken,
            Admission::LoopbackOnly => Exposure::Protected,
            Admission::Anyone => Exposure::Open,
        }
    }
}

/// Says at start who can use the port at `addr`. Protected mode gets one
/// calm line saying how to let other machines join; a port opened with
/// `--insecure-open-port` beyond loopback gets a warning that anyone who
/// reaches it can report counts; a token without TLS beyond loopback gets a
/// warning that it crosses the network in clear text.
pub(crate) fn announce_exposure(
    addr: SocketAddr,
    admission: &Admission,
    tls: bool,
    worker_tokens: bool,
) {
    let exposure = match Exposure::of(addr, admission, tls) {
        // Per-machine tokens close the port as the shared one does.
        Exposure::Protected | Exposure::Open if worker_tokens => Exposure::ClearToken,
        exposure => exposure,
    };
    match exposure {
        Exposure::Guarded => {}
        Exposure::Protected => info!(
            %addr,
            "protected mode: serving workers on this machine only; to let other \
             machines join, set the same NQ_TOKEN on the coordinator and its workers \
             (or serve TLS)"
        ),
        Exposure::Open => warn!(
            %addr,
            "--insecure-open-port: anyone who can reach {addr} can register as a \
             worker and report counts into this run; set NQ_TOKEN on the coordinator \
             and its workers, or serve TLS, to close it"
        ),
        Exposure::ClearToken => warn!(
            %addr,
            "the token crosses the network in clear text: add --tls-cert and --tls-key \
             unless the network is private"
        ),
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    /// A request as the server sees it, from `peer`.
    fn from(peer: &str) -> Request<()> {
        let mut request = Request::new(());
        let info = tonic::transport::server::TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(peer.parse().unwrap()),
        };
        request.extensions_mut().insert(info);
        request
    }

    #[test]
    fn calls_without_the_token_are_unauthenticated() {
        let token = Token::new("t0ken").unwrap();
        let mut check =
            CallerCheck::new(Admission::new(Some(token.clone()), false, false));
        let status = check.call(from("10.0.0.2:4000")).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("NQ_TOKEN"), "{status:?}");
        assert!(!nq_proto::auth::is_loopback_only(&status));
        let mut good = from("10.0.0.2:4000");
        good.metadata_mut()
            .insert(nq_proto::auth::AUTHORIZATION, token.header_value());
        assert!(check.call(good).is_ok());
        // With a token, loopback callers need it too.
        assert!(check.call(from("127.0.0.1:4000")).is_err());
    }

    #[test]
    fn a_worker_token_admits_its_machine_and_names_it() {
        let tokens =
            Arc::new(WorkerTokens::parse("rack1-a tok-a\nrack1-b tok-b").unwrap());
        let call = |peer: &str, token: Option<&str>| {
            let mut r = from(peer);
            if let Some(t) = token {
                r.metadata_mut().insert(
                    nq_proto::auth::AUTHORIZATION,
                    format!("Bearer {t}").parse().unwrap(),
                );
            }
            r
        };
        for admission in [
            Admission::new(None, false, false),
            Admission::new(None, true, false),
            Admission::new(None, false, true),
        ] {
            let mut check =
                CallerCheck::new(admission).with_worker_tokens(Some(Arc::clone(&tokens)));
            // Admitted from any address, and named by its token.
            for peer in ["10.0.0.2:1", "10.0.0.3:1", "127.0.0.1:1"] {
                let r = check.call(call(peer, Some("tok-b"))).unwrap();
                let credential = r.extensions().get::<Credential>().unwrap();
                assert_eq!(credential.0, "token:rack1-b");
            }
            // Without one of the tokens, nobody passes, not even loopback.
            for token in [None, Some("tok-c")] {
                let status = check.call(call("127.0.0.1:1", token)).unwrap_err();
                assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
            }
        }
        // Beside a shared token: the shared one still admits, unnamed.
        let shared = Token::new("shared").unwrap();
        let mut check = CallerCheck::new(Admission::new(Some(shared), false, false))
            .with_worker_tokens(Some(tokens));
        let r = check.call(call("10.0.0.9:1", Some("shared"))).unwrap();
        assert!(r.extensions().get::<Credential>().is_none());
        assert!(check.call(call("10.0.0.9:1", Some("other"))).is_err());
    }

    #[test]
    fn protected_mode_serves_loopback_peers_only() {
        let mut check = CallerCheck::new(Admission::new(None, false, false));
        for local in [
            "127.0.0.1:1",
            "127.3.2.1:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(check.call(from(local)).is_ok(), "{local}");
        }
        for remote in [
            "10.0.0.2:1",
            "192.168.1.5:1",
            "[2001:db8::1]:1",
            "[::ffff:10.0.0.1]:1",
        ] {
            let status = check.call(from(remote)).unwrap_err();
            assert!(
                nq_proto::auth::is_loopback_only(&status),
                "{remote}: {status:?}"
            );
            assert!(status.message().contains("--insecure-open-port"));
        }
        // No peer address: refused, not waved through.
        assert!(check.call(Request::new(())).is_err());
        // TLS or the explicit opt-out: everyone passes.
        for admission in [
            Admission::new(None, true, false),
            Admission::new(None, false, true),
        ] {
            assert!(CallerCheck::new(admission).call(from("10.0.0.2:1")).is_ok());
        }
    }

    #[test]
    fn only_ports_opened_by_hand_beyond_loopback_are_open() {
        let any: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let lan: SocketAddr = "[2001:db8::1]:50051".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let local6: SocketAddr = "[::1]:50051".parse().unwrap();
        let token = || Admission::new(Some(Token::new("t").unwrap()), false, false);
        let protected = Admission::new(None, false, false);
        let opened = Admission::new(None, false, true);
        for addr in [any, lan] {
            assert_eq!(Exposure::of(addr, &protected, false), Exposure::Protected);
            assert_eq!(Exposure::of(addr, &opened, false), Exposure::Open);
            assert_eq!(Exposure::of(addr, &token(), false), Exposure::ClearToken);
            assert_eq!(Exposure::of(addr, &protected, true), Exposure::Guarded);
            assert_eq!(Exposure::of(addr, &token(), true), Exposure::Guarded);
        }
        for addr in [local, local6] {
            assert_eq!(Exposure::of(addr, &opened, false), Exposure::Guarded);
            assert_eq!(Exposure::of(addr, &protected, false), Exposure::Guarded);
        }
    }
}
