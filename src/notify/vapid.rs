//! The gateway's VAPID key pair (RFC 8292): a P-256 key that identifies it
//! to push services. Browsers subscribe with the public half
//! (`PushManager.subscribe({applicationServerKey})`); every Web Push
//! request carries a JWT signed with the private half.
//!
//! Only the key handling lives here (generation from the OS RNG, the
//! encodings, the check that both halves belong together); where the pair
//! is kept is the store's business, and the signing is `web_push`'s.

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use p256::pkcs8::EncodePrivateKey as _;

/// A VAPID key pair, as stored and as handed to browsers.
#[derive(Clone, PartialEq, Eq)]
pub struct VapidKeys {
    /// The raw 32-byte P-256 scalar, base64url without padding.
    pub private_b64: String,
    /// The uncompressed 65-byte point, base64url without padding (what
    /// `GET /api/v1/notifications/vapid-public-key` answers).
    pub public_b64: String,
}

impl std::fmt::Debug for VapidKeys {
    /// Never prints the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VapidKeys")
            .field("public_b64", &self.public_b64)
            .finish_non_exhaustive()
    }
}

/// A new key pair from the operating system's random number generator.
pub fn generate() -> VapidKeys {
    let secret = p256::SecretKey::random(&mut rand_core::OsRng);
    VapidKeys {
        private_b64: URL_SAFE_NO_PAD.encode(secret.to_bytes()),
        public_b64: encode_public(&secret),
    }
}

/// The public key (uncompressed point, base64url) that belongs to
/// `private_b64`: to check a stored pair before using it.
pub fn public_key(private_b64: &str) -> anyhow::Result<String> {
    Ok(encode_public(&secret_key(private_b64)?))
}

impl VapidKeys {
    /// Fails unless the public half is the one of the private half.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            public_key(&self.private_b64)? == self.public_b64,
            "the VAPID public key does not belong to the private key"
        );
        Ok(())
    }

    /// The private key in the form the JWT signer takes (PKCS#8 DER).
    pub(crate) fn signing_key(&self) -> anyhow::Result<jsonwebtoken::EncodingKey> {
        let der = secret_key(&self.private_b64)?
            .to_pkcs8_der()
            .context("encoding the VAPID private key")?;
        Ok(jsonwebtoken::EncodingKey::from_ec_der(der.as_bytes()))
    }
}

fn secret_key(private_b64: &str) -> anyhow::Result<p256::SecretKey> {
    let raw = URL_SAFE_NO_PAD
        .decode(private_b64.trim_end_matches('='))
        .context("the VAPID private key is not base64url")?;
    anyhow::ensure!(
        raw.len() == 32,
        "the VAPID private key has {} bytes, not 32",
        raw.len()
    );
    p256::SecretKey::from_slice(&raw).context("the VAPID private key is not a P-256 scalar")
}

fn encode_public(secret: &p256::SecretKey) -> String {
    URL_SAFE_NO_PAD.encode(secret.public_key().to_encoded_point(false).as_bytes())
}

/// Kept in the database: made on first start, the same on every node.
impl VapidKeys {
    /// The stored pair, made and stored now if there is none; a stored pair
    /// whose halves do not belong together is an error, not replaced
    /// (browsers subscribed with its public key).
    pub async fn load(store: &dyn crate::store::Store) -> crate::error::Result<VapidKeys> {
        let fresh = generate();
        let (private_b64, public_b64) = store
            .vapid_keys((fresh.private_b64, fresh.public_b64))
            .await?;
        let keys = VapidKeys {
            private_b64,
            public_b64,
        };
        keys.check().map_err(|e| {
            crate::error::Error::Internal(anyhow::anyhow!("the stored VAPID key pair: {e}"))
        })?;
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_pair_holds_together_and_has_the_browser_encodings() {
        let keys = generate();
        keys.check().unwrap();
        assert_eq!(URL_SAFE_NO_PAD.decode(&keys.private_b64).unwrap().len(), 32);
        let public = URL_SAFE_NO_PAD.decode(&keys.public_b64).unwrap();
        assert_eq!(public.len(), 65);
        assert_eq!(public[0], 4, "uncompressed point");
        assert_ne!(generate().private_b64, keys.private_b64);
        keys.signing_key().unwrap();
    }

    #[test]
    fn a_mismatched_or_malformed_pair_is_refused() {
        let (a, b) = (generate(), generate());
        let mixed = VapidKeys {
            private_b64: a.private_b64.clone(),
            public_b64: b.public_b64,
        };
        assert!(mixed.check().is_err());
        assert!(public_key("not base64!").is_err());
        assert!(public_key(&URL_SAFE_NO_PAD.encode([1u8; 31])).is_err());
        // Zero is no scalar.
        assert!(public_key(&URL_SAFE_NO_PAD.encode([0u8; 32])).is_err());
        assert!(!format!("{a:?}").contains(&a.private_b64));
    }
}
