//! Bearer-token authentication of TCP clients.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use tonic::{Request, Status};
use tracing::warn;

/// Checks `authorization: Bearer <token>` on every call, comparing in
/// constant time. With no token configured it lets every call through
/// (Unix listeners authenticate by uid; an insecure TCP listener was asked
/// for explicitly).
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenCheck {
    token: Option<Arc<[u8]>>,
}

impl TokenCheck {
    pub(crate) fn new(token: Option<&str>) -> Self {
        TokenCheck {
            token: token.map(|t| Arc::from(t.as_bytes())),
        }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(req);
        };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.strip_prefix("Bearer "));
        match given {
            Some(g) if bool::from(g.as_bytes().ct_eq(token)) => Ok(req),
            Some(_) => {
                warn!(peer = ?req.remote_addr(), "refused a call with a wrong bearer token");
                Err(Status::unauthenticated("wrong bearer token"))
            }
            None => {
                warn!(peer = ?req.remote_addr(), "refused a call without a bearer token");
                Err(Status::unauthenticated(
                    "missing bearer token: send `authorization: Bearer <token>`",
                ))
            }
        }
    }
}
