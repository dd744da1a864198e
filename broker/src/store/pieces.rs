//! What each open hand-off of one host put before its model, grouped by the record that will
//! show it: the input every host's confirmation pass starts from (`claude/confirm.rs`,
//! `copilot/confirm.rs`). Which record shows a piece, and how, stays the host's.

use super::{Message, SettledBy, Store};
use crate::os::ProcessKey;
use anyhow::Result;
use courier_shared::ids::ThreadId;
use std::collections::HashMap;

/// One text a hand-off put before the model: a whole message, or one of its parts.
#[derive(Debug, Clone)]
pub struct Piece {
    pub text: String,
    /// Where its hand-off's record stood: it is shown after this.
    pub offset: u64,
    /// The agent process it was handed to.
    pub owner: Option<ProcessKey>,
}

/// Handed messages of one record, each with its pieces in order.
pub type Handed = Vec<(Message, Vec<Piece>)>;

impl Store {
    /// The handed messages (of `thread`, or all) whose channel `by` settles, by record path.
    pub fn handed_pieces(&self, thread: Option<&ThreadId>, by: SettledBy) -> Result<HashMap<String, Handed>> {
        let owner = |lease| -> Result<Option<ProcessKey>> {
            Ok(match lease {
                Some(t) => self.codex_of(t)?.map(|(pid, starttime)| ProcessKey { pid, starttime }),
                None => None,
            })
        };
        let mut by_record: HashMap<String, Handed> = HashMap::new();
        for m in self.handed(thread)?.into_iter().filter(|m| m.event.is_some_and(|c| c.settled_by() == by)) {
            let parts = self.parts(&m.id)?;
            let pieces = match parts.is_empty() {
                true => vec![Piece { text: m.wrapped(), offset: m.scan_offset.unwrap_or(0) as u64, owner: owner(m.lease)? }],
                false => parts
                    .iter()
                    .map(|p| Ok(Piece { text: m.wrapped_part(&p.part), offset: p.scan_offset, owner: owner(Some(p.lease))? }))
                    .collect::<Result<_>>()?,
            };
            if let Some(path) = m.rollout_path.clone() {
                by_record.entry(path).or_default().push((m, pieces));
            }
        }
        Ok(by_record)
    }
}
