//! The per-login secret and the request MAC. The secret is a 0600 file in the 0700 runtime
//! directory: only processes of this login that can read it can produce a valid request. The MAC
//! binds the payload to the sending pid and a timestamp, so a captured request cannot be replayed
//! from another process or much later.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub const SECRET_LEN: usize = 32;
/// How far a request's timestamp may be from the broker's clock.
pub const MAX_CLOCK_SKEW_MS: u64 = 30_000;

pub type Secret = [u8; SECRET_LEN];

/// Reads the secret, refusing a file that is not a regular 0600 file of this uid.
pub fn load_secret(path: &Path) -> io::Result<Secret> {
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.uid() != crate::paths::uid() || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} must be a regular file owned by uid {} with mode 0600", path.display(), crate::paths::uid()),
        ));
    }
    let mut secret = [0u8; SECRET_LEN];
    file.read_exact(&mut secret)?;
    Ok(secret)
}

fn mac_for(secret: &Secret, pid: u32, ts_ms: u64, payload: &[u8]) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("any key length works");
    mac.update(b"courier-hook-v1\0");
    mac.update(&pid.to_be_bytes());
    mac.update(&ts_ms.to_be_bytes());
    mac.update(payload);
    mac
}

pub fn sign(secret: &Secret, pid: u32, ts_ms: u64, payload: &[u8]) -> String {
    hex(&mac_for(secret, pid, ts_ms, payload).finalize().into_bytes())
}

/// Constant-time check of a hex MAC.
pub fn verify(secret: &Secret, pid: u32, ts_ms: u64, payload: &[u8], mac_hex: &str) -> bool {
    match unhex(mac_hex) {
        Some(tag) => mac_for(secret, pid, ts_ms, payload).verify_slice(&tag).is_ok(),
        None => false,
    }
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_binds_pid_time_and_payload() {
        let key = [7u8; SECRET_LEN];
        let tag = sign(&key, 10, 20, b"payload");
        assert!(verify(&key, 10, 20, b"payload", &tag));
        assert!(!verify(&key, 11, 20, b"payload", &tag));
        assert!(!verify(&key, 10, 21, b"payload", &tag));
        assert!(!verify(&key, 10, 20, b"payload!", &tag));
        assert!(!verify(&[8u8; SECRET_LEN], 10, 20, b"payload", &tag));
        assert!(!verify(&key, 10, 20, b"payload", "zz"));
    }

    #[test]
    fn hex_round_trip() {
        assert_eq!(unhex(&hex(&[0, 1, 254, 255])).unwrap(), vec![0, 1, 254, 255]);
        assert_eq!(unhex("abc"), None);
    }
}
