//! Bearer-token authentication and roles (docs/reference.md#http-api): `viewer` reads, `oncall`
//! also aborts and rolls back, `operator` does everything.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::error::ApiError;
use super::AppState;
use crate::config::Role;

/// Who is calling, from their token.
#[derive(Debug, Clone)]
pub struct Actor {
    pub name: String,
    pub role: Role,
}

impl Actor {
    pub fn require_rollback(&self) -> Result<(), ApiError> {
        self.require(self.role.can_rollback(), "abort or roll back")
    }

    /// Approving a waiting step lets a rollout go on: the operator's right, as starting one.
    pub fn require_approve(&self) -> Result<(), ApiError> {
        if self.role.can_operate() {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "{} (role {}) may not approve rollouts",
                self.name,
                self.role.as_str()
            )))
        }
    }

    pub fn require_operate(&self) -> Result<(), ApiError> {
        self.require(self.role.can_operate(), "start rollouts")
    }

    fn require(&self, allowed: bool, what: &str) -> Result<(), ApiError> {
        if allowed {
            Ok(())
        } else {
            Err(ApiError::Forbidden(format!(
                "{} (role {}) may not {what}",
                self.name,
                self.role.as_str()
            )))
        }
    }
}

/// Compares two secrets in time independent of where they differ and of their lengths: both
/// are hashed to 32 bytes, which `subtle` compares in constant time.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

impl FromRequestParts<AppState> for Actor {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let tokens = &state.tokens;
        if tokens.is_empty() {
            // Only possible on a loopback listener (serve refuses otherwise): a local user.
            return Ok(Actor {
                name: "local".to_owned(),
                role: Role::Operator,
            });
        }
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                ApiError::Unauthorized("missing Authorization: Bearer <token> header".into())
            })?;
        // The scheme is case-insensitive (RFC 7235): `bearer` and `BEARER` are `Bearer`.
        let presented = header
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token)
            .ok_or_else(|| {
                ApiError::Unauthorized("the Authorization header must be `Bearer <token>`".into())
            })?;
        let mut found = None;
        for token in tokens.iter() {
            if constant_time_eq(token.secret.expose().as_bytes(), presented.as_bytes()) {
                found = Some(Actor {
                    name: token.name.clone(),
                    role: token.role,
                });
            }
        }
        found.ok_or_else(|| ApiError::Unauthorized("invalid token".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
