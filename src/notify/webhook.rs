//! Webhooks: the notification's JSON body, POSTed as is, signed so the
//! receiver knows it came from this gateway:
//! `X-Acp-Gateway-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`
//! with the target's secret, and `X-Acp-Gateway-Delivery: <delivery_id>`.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

use super::http::{send, DELIVERY_HEADER};
use super::DeliveryOutcome;

/// The signature header.
pub const SIGNATURE_HEADER: &str = "X-Acp-Gateway-Signature";

/// The signature header's value for `body` sent at `t` (unix seconds).
pub fn signature(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// POSTs `body` (JSON) to `url`, signed with `secret`.
pub async fn deliver(
    client: &reqwest::Client,
    url: &str,
    secret: &str,
    delivery_id: Uuid,
    body: &[u8],
) -> DeliveryOutcome {
    let t = chrono::Utc::now().timestamp();
    send(
        client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature(secret, t, body))
            .header(DELIVERY_HEADER, delivery_id.to_string())
            .body(body.to_vec()),
    )
    .await
}

/// A new secret: 32 random bytes, hex.
pub fn new_secret() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_time_dot_body() {
        // Computed independently, with Python's standard library:
        // python3 -c 'import hmac,hashlib;print(hmac.new(b"key",b"1700000000.{}",hashlib.sha256).hexdigest())'
        assert_eq!(
            signature("key", 1_700_000_000, b"{}"),
            "t=1700000000,v1=9d713ed406bb7076d4123f0dc2c39d2df5c654ed4b0cd56b52c8b4c940bd63ae"
        );
    }
}
