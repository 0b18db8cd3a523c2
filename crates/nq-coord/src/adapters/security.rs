//! Who may talk to the coordinator: the token check on every call of the
//! `nqueens.v1.Coordinator` service, and the loud warning for a port that
//! anyone can use.
//!
//! The token's format and its constant-time comparison live in
//! [`nq_proto::auth`], shared with the worker; this module adds what only the
//! server does: refusing the call and logging the peer. The health and
//! reflection services are not wrapped: container probes and `grpcurl list`
//! work without a token, and neither reveals or changes anything of the run.

use std::net::SocketAddr;
use std::sync::Arc;

use nq_proto::auth::Token;
use tonic::{Request, Status};
use tracing::{error, warn};

/// The server interceptor: with a token, every call must carry it; without
/// one, every call passes.
#[derive(Clone, Debug)]
pub(crate) struct TokenCheck(Option<Arc<Token>>);

impl TokenCheck {
    pub(crate) fn new(token: Option<Token>) -> TokenCheck {
        TokenCheck(token.map(Arc::new))
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        match token.check(request.metadata()) {
            Ok(()) => Ok(request),
            Err(refusal) => {
                let peer = request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
                warn!(
                    %peer,
                    reason = refusal.as_str(),
                    "refused a call: this coordinator requires a token"
                );
                Err(refusal.status())
            }
        }
    }
}

/// How open a listening address is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// Loopback only, or protected by TLS.
    Guarded,
    /// Beyond loopback with a token but no TLS: the token crosses the
    /// network in clear text.
    ClearToken,
    /// Beyond loopback with neither token nor TLS: anyone who reaches the
    /// port can register and report counts.
    Open,
}

impl Exposure {
    pub(crate) fn of(addr: SocketAddr, token: bool, tls: bool) -> Exposure {
        match (addr.ip().is_loopback(), token, tls) {
            (true, _, _) | (false, _, true) => Exposure::Guarded,
            (false, true, false) => Exposure::ClearToken,
            (false, false, false) => Exposure::Open,
        }
    }
}

/// Says loudly, at start, when anyone who reaches `addr` could join the run
/// and report counts: a non-loopback address with neither token nor TLS. A
/// token without TLS on such an address crosses the network in clear text,
/// which gets a plain warning.
pub(crate) fn warn_if_exposed(addr: SocketAddr, token: bool, tls: bool) {
    match Exposure::of(addr, token, tls) {
        Exposure::Guarded => {}
        Exposure::Open => error!(
            %addr,
            "\n\
             ************************************************************************\n\
             * UNPROTECTED: listening on {addr} with neither a token nor TLS.\n\
             * Anyone who can reach this port can register as a worker and report\n\
             * counts into this run. Set --token (or NQ_TOKEN) on the coordinator\n\
             * and its workers, add --tls-cert/--tls-key (and --tls-client-ca for\n\
             * client certificates), or listen on 127.0.0.1 only.\n\
             ************************************************************************"
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

    #[test]
    fn calls_without_the_token_are_unauthenticated() {
        let token = Token::new("t0ken").unwrap();
        let mut check = TokenCheck::new(Some(token.clone()));
        let status = check.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);
        assert!(status.message().contains("NQ_TOKEN"), "{status:?}");
        let mut good = Request::new(());
        good.metadata_mut()
            .insert(nq_proto::auth::AUTHORIZATION, token.header_value());
        assert!(check.call(good).is_ok());
        // No token configured: everything passes.
        assert!(TokenCheck::new(None).call(Request::new(())).is_ok());
    }

    #[test]
    fn only_unprotected_ports_beyond_loopback_are_open() {
        let any: SocketAddr = "0.0.0.0:50051".parse().unwrap();
        let lan: SocketAddr = "[2001:db8::1]:50051".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:50051".parse().unwrap();
        let local6: SocketAddr = "[::1]:50051".parse().unwrap();
        for addr in [any, lan] {
            assert_eq!(Exposure::of(addr, false, false), Exposure::Open);
            assert_eq!(Exposure::of(addr, true, false), Exposure::ClearToken);
            assert_eq!(Exposure::of(addr, false, true), Exposure::Guarded);
            assert_eq!(Exposure::of(addr, true, true), Exposure::Guarded);
        }
        for addr in [local, local6] {
            assert_eq!(Exposure::of(addr, false, false), Exposure::Guarded);
        }
    }
}
