//! What the receiving side decides (docs/producers.md, "Names, inbound policy and modes"):
//! a thread's stable name ([`check_name`]), how urgent a message is ([`Mode`]), who sent it as
//! far as the broker can prove ([`SenderClass`]) and what the thread's inbound policy does with a
//! message of that class ([`Action`]). Every producer (CLI, socket, MCP, bridge) carries the same
//! names on the wire.

use serde::{Deserialize, Serialize};

/// How urgent a message is (`broker send --mode`, the socket's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// The next hook of the running turn, or a wake when the thread is idle (Courier's behaviour
    /// before modes existed).
    #[default]
    Steer,
    /// Never inside a running turn: a wake when the turn is over, or the next prompt's first hook.
    NextTurn,
    /// Interrupts the running turn through the app-server that owns the thread, then wakes it
    /// with the message.
    Interrupt,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Steer, Mode::NextTurn, Mode::Interrupt];

    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Steer => "steer",
            Mode::NextTurn => "next-turn",
            Mode::Interrupt => "interrupt",
        }
    }

    pub fn parse(s: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.as_str() == s)
    }
}

/// Who sent a message, as far as the broker can prove it: the key of an inbound policy rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SenderClass {
    /// A process of the user that runs unconfined (the kernel's word, as for approvals:
    /// `gate/person.rs`), sending through the running broker with no verified sender.
    Person,
    /// A model's tool call the broker verified (`from="thread:<id>" verified="true"`).
    Agent,
    /// Queued by the NATS bridge for a publisher on another host.
    Nats,
    /// Anything else: a confined process, or a producer that wrote the queue itself with no
    /// broker running to look at it.
    Local,
}

impl SenderClass {
    pub const ALL: [SenderClass; 4] = [SenderClass::Person, SenderClass::Agent, SenderClass::Nats, SenderClass::Local];

    pub const fn as_str(self) -> &'static str {
        match self {
            SenderClass::Person => "person",
            SenderClass::Agent => "agent",
            SenderClass::Nats => "nats",
            SenderClass::Local => "local",
        }
    }

    pub fn parse(s: &str) -> Option<SenderClass> {
        SenderClass::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// What a thread's inbound policy does with a message, from the least strict to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Queued as `pending`, as before policies existed.
    #[default]
    Accept,
    /// Queued as `held`: the model sees nothing of it until a person releases it.
    Hold,
    /// Not queued: the producer hears the policy's refusal.
    Refuse,
}

impl Action {
    pub const ALL: [Action; 3] = [Action::Accept, Action::Hold, Action::Refuse];

    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "accept",
            Action::Hold => "hold",
            Action::Refuse => "refuse",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        Action::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// Longest thread name, in bytes (all ASCII).
pub const MAX_NAME_LEN: usize = 64;

/// A thread name as `broker name` takes it: 1 to [`MAX_NAME_LEN`] ASCII letters, digits, `-`,
/// `_`, `.`, starting with a letter or digit (so it never reads as an option or a path), and not
/// shaped like a thread id or a message id (so an address means one thing).
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("a thread name is 1 to {MAX_NAME_LEN} characters"));
    }
    if let Some(bad) = name.chars().find(|c| !ok_char(*c)) {
        return Err(format!("{name:?}: a thread name has only letters, digits, '-', '_' and '.' (not {bad:?})"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!("{name:?}: a thread name starts with a letter or a digit"));
    }
    if courier_shared::ids::ThreadId::parse(name).is_ok() || is_message_id_shaped(name) {
        return Err(format!("{name:?} reads as a thread or message id; choose a name that does not"));
    }
    Ok(())
}

fn is_message_id_shaped(s: &str) -> bool {
    s.strip_prefix("m_").is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_serdes_and_round_trip() {
        for m in Mode::ALL {
            assert_eq!(serde_json::to_value(m).unwrap(), m.as_str());
            assert_eq!(Mode::parse(m.as_str()), Some(m));
        }
        for c in SenderClass::ALL {
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
            assert_eq!(SenderClass::parse(c.as_str()), Some(c));
        }
        for a in Action::ALL {
            assert_eq!(serde_json::to_value(a).unwrap(), a.as_str());
            assert_eq!(Action::parse(a.as_str()), Some(a));
        }
        assert!(Action::Accept < Action::Hold && Action::Hold < Action::Refuse, "stricter is greater");
    }

    #[test]
    fn thread_names_are_plain_and_unambiguous() {
        for good in ["reviewer", "ci-bot", "a.b_c-9", "9lives", &"x".repeat(MAX_NAME_LEN)] {
            assert_eq!(check_name(good), Ok(()), "{good:?}");
        }
        for bad in [
            "",
            "-x",
            ".hidden",
            "a b",
            "a/b",
            "é",
            "tab\t",
            &"x".repeat(MAX_NAME_LEN + 1),
            "01a22654-3b31-76f3-a48c-b65aa7d0db68",
            "m_0123456789abcdef",
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
