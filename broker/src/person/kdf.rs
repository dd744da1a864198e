//! PBKDF2-HMAC-SHA256 (RFC 8018), one 32-byte block: the person key's seed from the passphrase.
//! Written here on the `hmac` and `sha2` crates Courier already links (one block is a dozen
//! lines; a crate for it would add a build step and nothing else).

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The first 32-byte block of PBKDF2-HMAC-SHA256(`passphrase`, `salt`, `iterations`).
pub fn pbkdf2_sha256(passphrase: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    // The keyed state is built once and cloned per round: the inner and outer pads are hashed
    // once, so each round costs two compressions, as in every fast implementation.
    let keyed = HmacSha256::new_from_slice(passphrase).expect("HMAC takes a key of any length");
    let mut first = keyed.clone();
    first.update(salt);
    first.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = first.finalize().into_bytes().into();
    let mut out = u;
    for _ in 1..iterations.max(1) {
        let mut round = keyed.clone();
        round.update(&u);
        u = round.finalize().into_bytes().into();
        out.iter_mut().zip(u.iter()).for_each(|(o, x)| *o ^= x);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use courier_shared::auth::hex;

    /// RFC 7914 section 11's PBKDF2-HMAC-SHA256 vectors (their first 32 bytes).
    #[test]
    fn matches_the_rfc_vectors() {
        assert_eq!(hex(&pbkdf2_sha256(b"passwd", b"salt", 1)), "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc");
        assert_eq!(hex(&pbkdf2_sha256(b"Password", b"NaCl", 80000)), "4ddcd8f60b98be21830cee5ef22701f9641a4418d04c0414aeff08876b34ab56");
    }

    #[test]
    fn every_input_changes_the_key() {
        let base = pbkdf2_sha256(b"a passphrase", b"salt", 3);
        assert_ne!(base, pbkdf2_sha256(b"a passphrasf", b"salt", 3));
        assert_ne!(base, pbkdf2_sha256(b"a passphrase", b"salu", 3));
        assert_ne!(base, pbkdf2_sha256(b"a passphrase", b"salt", 4));
    }
}
