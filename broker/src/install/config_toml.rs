//! Codex's `config.toml`: the trust entries for Courier's handlers, edited format-preserving.

use super::manifest::Manifest;
use anyhow::{Context, Result};

// config.toml trust entries (format-preserving)

pub(super) fn ensure_table<'a>(
    parent: &'a mut dyn toml_edit::TableLike,
    key: &str,
    created: &mut bool,
) -> Result<&'a mut dyn toml_edit::TableLike> {
    if !parent.contains_key(key) {
        let mut t = toml_edit::Table::new();
        t.set_implicit(true);
        parent.insert(key, toml_edit::Item::Table(t));
        *created = true;
    }
    parent.get_mut(key).and_then(|i| i.as_table_like_mut()).with_context(|| format!("`{key}` in config.toml is not a table"))
}

/// Sets `hooks.state."<key>".trusted_hash` for each entry and removes `stale` keys install wrote
/// earlier (only while they still hold the hash install wrote).
pub fn add_trust(
    doc: &mut toml_edit::DocumentMut,
    entries: &[(String, String)],
    stale: &[(String, String)],
    m: &mut Manifest,
) -> Result<()> {
    let (mut made_hooks, mut made_state) = (false, false);
    let hooks = ensure_table(doc.as_table_mut(), "hooks", &mut made_hooks)?;
    let state = ensure_table(hooks, "state", &mut made_state)?;
    for (key, hash) in stale {
        if !entries.iter().any(|(k, _)| k == key) && trusted_hash(state, key).as_deref() == Some(hash) {
            state.remove(key);
        }
    }
    for (key, hash) in entries {
        if trusted_hash(state, key).as_deref() == Some(hash.as_str()) {
            continue;
        }
        match state.get_mut(key).and_then(|i| i.as_table_like_mut()) {
            Some(t) => {
                t.insert("trusted_hash", toml_edit::value(hash.as_str()));
            }
            None => {
                let mut t = toml_edit::Table::new();
                t.insert("trusted_hash", toml_edit::value(hash.as_str()));
                if state_is_inline(state) {
                    state.insert(key, toml_edit::Item::Value(toml_edit::Value::InlineTable(t.into_inline_table())));
                } else {
                    state.insert(key, toml_edit::Item::Table(t));
                }
            }
        }
    }
    for (made, name) in [(made_hooks, "hooks"), (made_state, "hooks.state")] {
        if made && !m.created_tables.iter().any(|t| t == name) {
            m.created_tables.push(name.into());
        }
    }
    Ok(())
}

pub(super) fn state_is_inline(state: &dyn toml_edit::TableLike) -> bool {
    state.iter().next().is_some_and(|(_, i)| i.is_inline_table())
}

pub(super) fn trusted_hash(state: &dyn toml_edit::TableLike, key: &str) -> Option<String> {
    state.get(key)?.as_table_like()?.get("trusted_hash")?.as_str().map(str::to_string)
}

/// Structural inverse of [`add_trust`].
pub fn remove_trust(doc: &mut toml_edit::DocumentMut, m: &Manifest) {
    let root = doc.as_table_mut();
    let Some(hooks) = root.get_mut("hooks").and_then(|i| i.as_table_like_mut()) else { return };
    if let Some(state) = hooks.get_mut("state").and_then(|i| i.as_table_like_mut()) {
        for (key, hash) in &m.trust_entries {
            if trusted_hash(state, key).as_deref() == Some(hash.as_str()) {
                state.remove(key);
            }
        }
        if state.is_empty() && m.created_tables.iter().any(|t| t == "hooks.state") {
            hooks.remove("state");
        }
    }
    if hooks.is_empty() && m.created_tables.iter().any(|t| t == "hooks") {
        root.remove("hooks");
    }
}
