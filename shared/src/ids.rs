//! Thread ids as every Courier binary checks them: a lowercase UUID; and the variables a host
//! names its session in.

use std::borrow::Cow;

/// The variable Claude Code names its session in, for the commands its model runs and the MCP
/// servers it starts (probed on 2.1.332).
pub const CLAUDE_SESSION_VAR: &str = "CLAUDE_CODE_SESSION_ID";
/// The variable GitHub Copilot CLI names its session in, for the commands its model runs and the
/// MCP servers it starts (probed on 1.0.102).
pub const COPILOT_SESSION_VAR: &str = "COPILOT_AGENT_SESSION_ID";
/// Every host's session variable: a process with one claims to run for that session (the
/// broker's sender proof checks the claim, `gate/session_sender.rs`).
pub const SESSION_VARS: [&str; 2] = [CLAUDE_SESSION_VAR, COPILOT_SESSION_VAR];

pub const fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 36 {
        return false;
    }
    let mut i = 0;
    while i < 36 {
        let ok = match i {
            8 | 13 | 18 | 23 => b[i] == b'-',
            _ => b[i].is_ascii_digit() || matches!(b[i], b'a'..=b'f'),
        };
        if !ok {
            return false;
        }
        i += 1;
    }
    true
}

/// A Codex thread id, checked once where it enters (the command line, the socket, MCP, the
/// bridge, a hook payload, a rollout's name): past that edge a thread is this type, never a bare
/// string, so an unchecked id cannot reach the queue or a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ThreadId(Cow<'static, str>);

/// Text that is not a thread id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAThreadId(pub String);

impl std::fmt::Display for NotAThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} is not a thread id (a lowercase UUID, as in the rollout file name)", self.0)
    }
}

impl std::error::Error for NotAThreadId {}

impl ThreadId {
    pub fn parse(s: &str) -> Result<ThreadId, NotAThreadId> {
        ThreadId::try_from(s.to_string())
    }

    /// A thread id written in the source (tests, fixtures), checked when it compiles.
    pub const fn from_static(s: &'static str) -> ThreadId {
        assert!(is_uuid(s), "not a thread id");
        ThreadId(Cow::Borrowed(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ThreadId {
    type Error = NotAThreadId;
    fn try_from(s: String) -> Result<ThreadId, NotAThreadId> {
        if is_uuid(&s) {
            Ok(ThreadId(Cow::Owned(s)))
        } else {
            Err(NotAThreadId(s))
        }
    }
}

impl std::str::FromStr for ThreadId {
    type Err = NotAThreadId;
    fn from_str(s: &str) -> Result<ThreadId, NotAThreadId> {
        ThreadId::parse(s)
    }
}

impl From<ThreadId> for String {
    fn from(t: ThreadId) -> String {
        t.0.into_owned()
    }
}

impl AsRef<str> for ThreadId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ThreadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for ThreadId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ThreadId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_id_is_a_lowercase_uuid_checked_on_every_way_in() {
        let good = "019a0000-0000-7000-8000-0000000000ab";
        assert_eq!(ThreadId::parse(good).map(|t| t.to_string()), Ok(good.to_string()));
        for bad in ["", "t", "019A0000-0000-7000-8000-0000000000AB", "019a0000-0000-7000-8000-0000000000ab\n", "../../etc/passwd"] {
            assert_eq!(ThreadId::parse(bad), Err(NotAThreadId(bad.to_string())), "{bad:?}");
            assert!(serde_json::from_value::<ThreadId>(serde_json::json!(bad)).is_err(), "{bad:?}");
        }
        let t: ThreadId = serde_json::from_value(serde_json::json!(good)).unwrap();
        assert_eq!(serde_json::to_value(&t).unwrap(), serde_json::json!(good));
    }
}
