//! The gateway's VAPID key pair (RFC 8292), which identifies it to push
//! services: made on first start, kept in the database, the same on every
//! node. Browsers subscribe with its public key
//! (`GET /api/v1/notifications/vapid-public-key`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::store::Store;

/// A P-256 key pair, base64url without padding: the raw 32-byte private
/// scalar, and the uncompressed public point (65 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct VapidKeys {
    pub private_b64: String,
    pub public_b64: String,
}

impl std::fmt::Debug for VapidKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VapidKeys")
            .field("public_b64", &self.public_b64)
            .finish_non_exhaustive()
    }
}

impl VapidKeys {
    /// A new key pair.
    pub fn generate() -> VapidKeys {
        let secret = p256::SecretKey::random(&mut rand::rngs::OsRng);
        let public = secret.public_key();
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        VapidKeys {
            private_b64: URL_SAFE_NO_PAD.encode(secret.to_bytes()),
            public_b64: URL_SAFE_NO_PAD.encode(public.to_encoded_point(false).as_bytes()),
        }
    }

    /// The stored pair, made and stored now if there is none.
    pub async fn load(store: &dyn Store) -> crate::error::Result<VapidKeys> {
        let fresh = VapidKeys::generate();
        let (private_b64, public_b64) = store
            .vapid_keys((fresh.private_b64, fresh.public_b64))
            .await?;
        Ok(VapidKeys {
            private_b64,
            public_b64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_key_is_the_private_keys_uncompressed_point() {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let keys = VapidKeys::generate();
        let private = URL_SAFE_NO_PAD.decode(&keys.private_b64).unwrap();
        let public = URL_SAFE_NO_PAD.decode(&keys.public_b64).unwrap();
        assert_eq!((private.len(), public.len(), public[0]), (32, 65, 4));
        let secret = p256::SecretKey::from_slice(&private).unwrap();
        assert_eq!(
            secret.public_key().to_encoded_point(false).as_bytes(),
            &public[..]
        );
    }
}
