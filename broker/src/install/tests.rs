use super::systemd::unit_quote;
use super::*;
use serde_json::{json, Value};

#[test]
fn trust_hash_matches_python_port() {
    // Values printed by a Python port of Codex's own hash function; Codex accepts them (the
    // install end-to-end tests run real sessions with these trust entries).
    assert_eq!(
        hook_trust_hash("PostToolUse", "/bin/true", 5, None, None, None),
        "sha256:0e59abad07037762a34c3ef81edcab683a6bd8548bf56109ef5e66f1eeaaadc7"
    );
    assert_eq!(
        hook_trust_hash(
            "Stop",
            "/usr/bin/python3.11 /home/dev/probe/kit/hook_probe.py Stop",
            30,
            Some("Bash|apply_patch"),
            Some("hi \"x\" \u{e9}"),
            None
        ),
        "sha256:964faa913fb44c21006cf58db5427bf20576281281bada5c202e46c9ed4c5364"
    );
    assert_eq!(
        hook_trust_hash("SessionEnd", "x", 30, None, None, None),
        "sha256:b1aa6329f3a5daf36ae487200db1136f90a884bb805ddb24a6326c98dd6f29f6"
    );
}

#[test]
fn merge_appends_after_user_groups_and_is_idempotent() {
    let mut m = Manifest::default();
    let mut doc: Value =
        serde_json::from_str(r#"{"hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[{"type":"command","command":"mine"}]}]},"other":1}"#)
            .unwrap();
    let before = doc.clone();
    let g = merge_hooks(&mut doc, "/p/hook-client", &[], &mut m).unwrap();
    assert!(g.contains(&("PreToolUse".to_string(), 1)) && g.contains(&("Stop".to_string(), 0)), "{g:?}");
    // Key order kept: the user's event first, then ours.
    let keys: Vec<&String> = doc["hooks"].as_object().unwrap().keys().collect();
    assert_eq!(keys[0], "PreToolUse");
    let once = doc.clone();
    assert_eq!(merge_hooks(&mut doc, "/p/hook-client", &["/p/hook-client".into()], &mut m).unwrap(), g);
    assert_eq!(doc, once);
    m.commands = vec!["/p/hook-client".into()];
    unmerge_hooks(&mut doc, &m);
    assert_eq!(doc, before);
}

#[test]
fn new_prefix_replaces_old_handlers() {
    let mut m = Manifest::default();
    let mut doc = json!({});
    merge_hooks(&mut doc, "/old/hook-client", &[], &mut m).unwrap();
    merge_hooks(&mut doc, "/new/hook-client", &["/old/hook-client".into()], &mut m).unwrap();
    let text = doc.to_string();
    assert!(!text.contains("/old/") && text.matches("/new/hook-client").count() == EVENTS.len(), "{text}");
}

#[test]
fn trust_edit_keeps_comments_and_reverts() {
    let original =
        "# my settings\nmodel = \"x\" # inline comment\n\n[hooks.state.\"/h/hooks.json:stop:0:0\"]\ntrusted_hash = \"sha256:user\"\n";
    let mut doc: toml_edit::DocumentMut = original.parse().unwrap();
    let mut m = Manifest::default();
    let entries = vec![("/h/hooks.json:stop:1:0".to_string(), "sha256:ours".to_string())];
    add_trust(&mut doc, &entries, &[], &mut m).unwrap();
    let text = doc.to_string();
    assert!(text.starts_with("# my settings\nmodel = \"x\" # inline comment\n"), "{text}");
    assert!(text.contains("[hooks.state.\"/h/hooks.json:stop:1:0\"]\ntrusted_hash = \"sha256:ours\""), "{text}");
    assert!(m.created_tables.is_empty());
    m.trust_entries = entries;
    remove_trust(&mut doc, &m);
    assert_eq!(doc.to_string(), original);
}

#[test]
fn trust_edit_on_empty_config_creates_and_removes_tables() {
    let mut doc: toml_edit::DocumentMut = "model = \"x\"\n".parse().unwrap();
    let mut m = Manifest::default();
    let entries = vec![("/h/hooks.json:stop:0:0".to_string(), "sha256:ours".to_string())];
    add_trust(&mut doc, &entries, &[], &mut m).unwrap();
    let text = doc.to_string();
    assert!(!text.contains("[hooks]") && !text.contains("[hooks.state]\n"), "implicit parents: {text}");
    m.trust_entries = entries;
    remove_trust(&mut doc, &m);
    assert_eq!(doc.to_string(), "model = \"x\"\n");
}

#[test]
fn unit_values_are_escaped() {
    assert_eq!(unit_quote("/a/b", true), "/a/b");
    assert_eq!(unit_quote("/a b/100%$x", true), "\"/a b/100%%$$x\"");
}

#[test]
fn hooks_list_parse_reads_every_handler_and_defaults_missing_fields() {
    let result = serde_json::json!({"data": [
        {"cwd": "/w", "hooks": [
            {"key": "/h/hooks.json:post_tool_use:0:0", "eventName": "postToolUse", "command": "/bin/hc",
             "currentHash": "sha256:ab", "trustStatus": "trusted", "enabled": false},
            {"key": "k2", "eventName": "stop", "command": 7}
        ]},
        {"cwd": "/x"},
        {"cwd": "/y", "hooks": [{"key": "k3"}]}
    ]});
    let got = parse_hooks_list(&result);
    let keys: Vec<&str> = got.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(keys, ["/h/hooks.json:post_tool_use:0:0", "k2", "k3"]);
    let first = &got[0];
    assert_eq!(
        (first.event.as_str(), first.command.as_str(), first.current_hash.as_str(), first.trust_status.as_str(), first.enabled),
        ("postToolUse", "/bin/hc", "sha256:ab", "trusted", false)
    );
    // A field of the wrong type reads as empty, a missing `enabled` as true.
    assert_eq!((got[1].command.as_str(), got[1].trust_status.as_str(), got[1].enabled), ("", "", true));
    assert_eq!(got[2].raw, serde_json::json!({"key": "k3"}));
    assert!(parse_hooks_list(&serde_json::json!({"data": "nope"})).is_empty());
}

/// Every file under `dir` but those under `except`, with its bytes.
fn files_under(dir: &Path, except: &Path, out: &mut std::collections::BTreeMap<PathBuf, Vec<u8>>) {
    for e in fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.starts_with(except) {
            continue;
        }
        if p.is_dir() {
            files_under(&p, except, out);
        } else {
            out.insert(p.clone(), fs::read(&p).unwrap());
        }
    }
}

/// Each host agent's row edits exactly the config files it names (`HostAgent::config_files`),
/// and its uninstall gives them back byte for byte. The rows see a sandboxed HOME,
/// CLAUDE_CONFIG_DIR and Courier config through the `AgentEnv` they are given, never this
/// (multithreaded) test process's environment.
#[test]
fn each_agent_row_edits_only_the_config_files_it_names() {
    let dir = std::env::temp_dir().join(format!("courier-agent-rows-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (home, state) = (dir.join("home"), dir.join("state"));
    let env = AgentEnv {
        home: Some(home.clone()),
        codex_home: home.join(".codex"),
        claude_config_dir: Some(dir.join("claude-config").into()),
        courier_config: dir.join("courier/config.toml"),
        path_var: None,
        copilot_home: None,
    };
    for d in [&env.codex_home, &dir.join("claude-config"), &dir.join("courier"), &state, &home.join(".copilot")] {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(env.codex_home.join("config.toml"), "model = \"m\" # the user's\n").unwrap();
    fs::write(env.codex_home.join("other.json"), "{}").unwrap();
    fs::write(dir.join("claude-config/settings.json"), "{\n    \"model\": \"the user's\"\n}\n").unwrap();
    fs::write(dir.join("claude-config/.claude.json"), "{\"numStartups\": 3, \"mcpServers\": {\"mine\": {\"command\": \"x\"}}}").unwrap();
    fs::write(&env.courier_config, "# the user's\nlog_level = \"info\"\n").unwrap();
    let opts = InstallOptions {
        prefix: dir.join("prefix"),
        codex_home: env.codex_home.clone(),
        start: StartMode::None,
        no_enable: true,
        mcp: true,
        allow_courier_tools: false,
        bridge: None,
        claude: ClaudeChoice::Register,
    };
    let mut run = carry::Run { opts: &opts, state_dir: state.clone(), env: env.clone(), m: Manifest::default(), report: Report::new() };
    let bins = carry::Binaries {
        broker: dir.join("prefix/broker"),
        client: dir.join("prefix/hook-client"),
        replaced: false,
        with_mcp: true,
        with_bridge: false,
    };
    for agent in HostAgent::ALL {
        assert_eq!(agent.wanted(&run).unwrap(), agent::Wanted::Install, "{}", agent.name());
        let mut before = Default::default();
        files_under(&dir, &state, &mut before);
        agent.register_hooks(&mut run, &bins).unwrap();
        let mut after = Default::default();
        files_under(&dir, &state, &mut after);
        let mut changed: Vec<PathBuf> = after.iter().filter(|(p, bytes)| before.get(*p) != Some(*bytes)).map(|(p, _)| p.clone()).collect();
        changed.sort();
        let mut named = agent.config_files(&env).unwrap();
        named.sort();
        assert_eq!(changed, named, "{}", agent.name());
        agent.uninstall(&run.m, &state, &mut Report::new()).unwrap();
        let mut restored = Default::default();
        files_under(&dir, &state, &mut restored);
        assert_eq!(restored, before, "{}: uninstall gives the files back", agent.name());
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Copilot CLI's MCP config: `broker install` adds `mcpServers.courier` (a local server running
/// `<broker> mcp`, as `copilot mcp add` writes one) beside the user's servers, a second install
/// changes nothing, and uninstall takes out only Courier's entry: the bytes back when nobody
/// touched the file, the user's later server kept when they did.
#[test]
fn copilot_mcp_config_gets_courier_s_server_beside_the_user_s_and_loses_only_it() {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("courier-copilot-mcp-{}-{n}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let (home, state) = (dir.join("home"), dir.join("state"));
    let copilot_home = home.join(".copilot");
    for d in [&copilot_home, &state] {
        fs::create_dir_all(d).unwrap();
    }
    let env = AgentEnv {
        home: Some(home.clone()),
        codex_home: home.join(".codex"),
        claude_config_dir: None,
        courier_config: dir.join("courier/config.toml"),
        path_var: None,
        copilot_home: None,
    };
    let config = copilot_home.join("mcp-config.json");
    let users = "{\n  \"mcpServers\": {\n    \"mine\": {\n      \"type\": \"local\",\n      \"command\": \"/bin/mine\",\n      \"args\": [],\n      \"tools\": [\"*\"]\n    }\n  }\n}\n";
    fs::write(&config, users).unwrap();
    let opts = InstallOptions {
        prefix: dir.join("prefix"),
        codex_home: env.codex_home.clone(),
        start: StartMode::None,
        no_enable: true,
        mcp: true,
        allow_courier_tools: false,
        bridge: None,
        claude: ClaudeChoice::Skip,
    };
    let mut run = carry::Run { opts: &opts, state_dir: state.clone(), env, m: Manifest::default(), report: Report::new() };
    let bins = carry::Binaries {
        broker: dir.join("prefix/broker"),
        client: dir.join("prefix/hook-client"),
        replaced: false,
        with_mcp: true,
        with_bridge: false,
    };
    let read = || serde_json::from_str::<serde_json::Value>(&fs::read_to_string(&config).unwrap()).unwrap();
    HostAgent::Copilot.register_hooks(&mut run, &bins).unwrap();
    let doc = read();
    assert_eq!(doc["mcpServers"]["mine"]["command"], "/bin/mine", "the user's server kept: {doc}");
    let ours = &doc["mcpServers"]["courier"];
    assert_eq!((ours["type"].as_str(), ours["command"].as_str()), (Some("local"), Some(bins.broker.to_str().unwrap())), "{doc}");
    assert_eq!((ours["args"].clone(), ours["tools"].clone()), (serde_json::json!(["mcp"]), serde_json::json!(["*"])), "{doc}");
    let installed = fs::read(&config).unwrap();
    HostAgent::Copilot.register_hooks(&mut run, &bins).unwrap();
    assert_eq!(fs::read(&config).unwrap(), installed, "a second install changes nothing");
    HostAgent::Copilot.uninstall(&run.m, &state, &mut Report::new()).unwrap();
    assert_eq!(fs::read_to_string(&config).unwrap(), users, "untouched since: the bytes back");

    // Installed again, then the user adds a server: uninstall takes out only Courier's entry.
    let mut run = carry::Run { m: Manifest::default(), report: Report::new(), ..run };
    HostAgent::Copilot.register_hooks(&mut run, &bins).unwrap();
    let mut doc = read();
    doc["mcpServers"]["later"] = serde_json::json!({"type": "local", "command": "/bin/later", "args": []});
    fs::write(&config, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    HostAgent::Copilot.uninstall(&run.m, &state, &mut Report::new()).unwrap();
    let doc = read();
    let mut names: Vec<&String> = doc["mcpServers"].as_object().unwrap().keys().collect();
    names.sort();
    assert_eq!(names, ["later", "mine"], "{doc}");
    let _ = fs::remove_dir_all(&dir);
}
