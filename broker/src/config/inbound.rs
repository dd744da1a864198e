//! The `[inbound]` section of the Courier config file: what a thread's inbound policy does with a
//! message when the thread has no rule of its own for its sender's class (`broker inbound`, the
//! rules themselves, are the store's; docs/producers.md, "Inbound policy").
//!
//! ```toml
//! [inbound]
//! default = "accept"   # accept | hold | refuse: every class with no line of its own
//! nats = "hold"        # per class: person, agent, nats, local
//! ```

use courier_producer_proto::{Action, SenderClass};
use serde::Deserialize;

/// `[inbound]` of Courier's config file.
#[derive(Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InboundConfig {
    /// For every class with no line of its own; `accept` (as before policies) by default.
    #[serde(default)]
    pub default: Action,
    pub person: Option<Action>,
    pub agent: Option<Action>,
    pub nats: Option<Action>,
    pub local: Option<Action>,
}

impl InboundConfig {
    /// What a thread with no rule of its own does with a message of `class`.
    pub fn action(&self, class: SenderClass) -> Action {
        let own = match class {
            SenderClass::Person => self.person,
            SenderClass::Agent => self.agent,
            SenderClass::Nats => self.nats,
            SenderClass::Local => self.local,
        };
        own.unwrap_or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_line_wins_over_the_default() {
        let (c, _) = crate::config::parse("[inbound]\ndefault = \"hold\"\nperson = \"accept\"\n").unwrap();
        assert_eq!(c.inbound.action(SenderClass::Person), Action::Accept);
        assert_eq!(c.inbound.action(SenderClass::Nats), Action::Hold);
        assert_eq!(crate::config::Config::default().inbound.action(SenderClass::Local), Action::Accept, "accept, as before");
        assert!(crate::config::parse("[inbound]\ndefault = \"drop\"\n").is_err());
        assert!(crate::config::parse("[inbound]\nrobots = \"hold\"\n").is_err());
    }
}
