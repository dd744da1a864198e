//! A guided tour of Courier with the real Codex CLI, entirely offline:
//!
//!     cargo build --workspace && cargo run -p courier-tests --bin courier-demo
//!
//! It makes a throwaway CODEX_HOME whose hooks run hook-client, starts a scripted model and a
//! broker, runs `codex exec`, and while the model is "thinking" (its first reply is held) sends a
//! message with `broker send`. Then it shows the model request that carried the message and
//! `broker inspect` reporting it confirmed.

use std::time::Duration;

use courier_tests::broker::hook_command;
use courier_tests::{Broker, CodexEnv, Hold, Reply, Request, ScriptedModel};

const T: Duration = Duration::from_secs(60);

fn bold(s: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        format!("\x1b[1m{s}\x1b[0m")
    } else {
        s.to_string()
    }
}

fn step(n: u32, text: &str) {
    println!("\n{}", bold(&format!("[{n}] {text}")));
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

fn main() {
    println!("Courier demo: deliver a message into a live Codex session through its own hooks.");

    step(1, "Start a scripted model (a fake OpenAI Responses API on 127.0.0.1)");
    let hold = Hold::new();
    let h = hold.clone();
    let model = ScriptedModel::start_with(move |r: &Request| {
        if r.function_calls().is_empty() {
            // First answer: run a shell command. Held until we have sent our message.
            Reply::exec("echo hello from the model").held(&h)
        } else {
            Reply::message("All done.")
        }
    });
    println!("    provider base_url = {}", model.base_url());

    step(2, "Create a throwaway CODEX_HOME whose hooks run hook-client (trusted)");
    let env = CodexEnv::with_hook_command(&model, &hook_command());
    println!("    CODEX_HOME          = {}", env.codex_home.display());
    println!("    hook command        = {}", hook_command());
    println!("    COURIER_RUNTIME_DIR = {}", env.runtime_dir.display());
    let trusted = env.hooks_list().iter().filter(|h| h.trust_status == "trusted").count();
    println!("    Codex reports {trusted} of {} hooks trusted", env.hooks().len());

    step(3, "Start `broker serve` and trust this Codex binary");
    let broker = Broker::start(&env);
    broker.trust_codex(&env.codex);
    println!("    broker pid {}, socket {}", broker.pid().unwrap_or(0), broker.socket_path().display());
    println!("    codex = {}", env.codex.display());

    step(4, "Run `codex exec \"tidy up the repo\"`; the model's first reply is held");
    let child = env.spawn_exec("tidy up the repo");
    let first = model.wait_for_requests(1, T).remove(0);
    hold.wait_held(1, T);
    let thread = first.thread_id().expect("Codex names the thread in each request");
    println!("    thread id: {}", bold(&thread));

    step(5, "While the model is generating, send a message to that thread");
    let text = "Heads up: the CI is red on main, please check before pushing.";
    println!("    $ broker send --thread {thread} --from demo \"{text}\"");
    let id = broker.send_opts(&thread, text, None, Some("demo"));
    println!("    {id}");
    println!("    state now: {}", broker.message_state(&id));

    step(6, "Release the model: it calls exec_command; Codex runs the PreToolUse/PostToolUse hooks");
    hold.release();
    let out = child.wait(T);
    out.assert_success();
    println!("    codex exec finished ({}), final answer: {:?}", out.status, out.stdout.trim());

    step(7, "The model request that carried the message");
    let carrier =
        model.requests().into_iter().find(|r| !r.developer_messages_containing(text).is_empty()).expect("a request carries the message");
    println!(
        "    request #{} (thread {}, turn {})",
        carrier.index,
        carrier.thread_id().unwrap_or_default(),
        carrier.turn_id().unwrap_or_default()
    );
    for m in carrier.developer_messages_containing(text) {
        println!("    developer message:\n{}", indent(&m));
    }

    step(8, "`broker inspect`: the message is confirmed from the rollout");
    broker.wait_state(&id, "confirmed", Duration::from_secs(10));
    println!("{}", indent(&broker.inspect_text()));

    println!("\nDone. (Set COURIER_KEEP_TEST_DIRS=1 to keep {} for a closer look.)", env.root.display());
}
