//! The configuration's second step: the files it names, read once,
//! bounded, each failure on its field.

use super::tests::{MINIMAL, errors_of};
use super::*;

/// The parse reads nothing: files that do not exist are kept as paths, and
/// the load step names each with its field.
#[test]
fn the_parse_reads_no_file_and_the_load_step_names_each_missing_one() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let missing = |name: &str| dir.join(name).display().to_string();
    let text = format!(
        "[exporter]\nweb_config = \"{web}\"\nadmin_token_file = \"{token}\"\n\
[notify.email]\nsmtp_host = \"smtp.example\"\nfrom = \"s@example.com\"\nto = [\"a@example.com\"]\n\
username_file = \"{user}\"\npassword_file = \"{password}\"\nca_file = \"{ca}\"\n\
[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\napi_key_file = \"{key}\"\n\
[[scenarios]]\nname = \"d\"\ndataset_path = \"{dataset}\"\nconcurrency = 2\n\
[[scenarios]]\nname = \"s\"\ninput_len = 4\noutput_len = 4\n",
        web = missing("web.yml"),
        token = missing("token"),
        user = missing("user"),
        password = missing("password"),
        ca = missing("ca.pem"),
        key = missing("key"),
        dataset = missing("prompts.jsonl"),
    );
    let parsed = Config::parse(&text, "t").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        parsed
            .named_files()
            .into_iter()
            .map(|(field, path)| (field.to_owned(), path.display().to_string()))
            .collect::<Vec<_>>(),
        [
            ("exporter.web_config", missing("web.yml")),
            ("notify.email.ca_file", missing("ca.pem")),
            ("scenarios[0].dataset_path", missing("prompts.jsonl")),
        ]
        .map(|(field, path)| (field.to_owned(), path))
    );
    // Key files are read when a key is needed, never with the configuration.
    assert_eq!(
        parsed.targets[0].api_key,
        Some(SecretSource::File(dir.join("key")))
    );
    assert!(
        parsed.scenarios[0]
            .dataset
            .as_ref()
            .unwrap()
            .content()
            .is_none()
    );

    let errors: Vec<String> = parsed
        .load_files()
        .unwrap_err()
        .field_errors()
        .iter()
        .map(ToString::to_string)
        .collect();
    let not_found = "No such file or directory (os error 2)";
    assert_eq!(
        errors,
        [
            format!(
                "exporter.web_config: {}: (file): {not_found}",
                missing("web.yml")
            ),
            format!(
                "notify.email.ca_file: cannot read {:?}: {not_found}",
                missing("ca.pem")
            ),
            format!(
                "scenarios[0].dataset_path: cannot read {}: {not_found}",
                missing("prompts.jsonl")
            ),
        ]
    );
}

/// A web configuration that is a device or a FIFO is refused unread, on
/// its field, with the parse's own errors.
#[test]
fn a_web_config_that_is_a_device_or_a_fifo_is_refused_on_its_field() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let zero = dir.join("zero.yml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let fifo = dir.join("fifo.yml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    for (path, kind) in [
        (&zero, "a character device"),
        (&fifo, "a FIFO (named pipe)"),
    ] {
        let text = format!(
            "[exporter]\nweb_config = \"{}\"\nlisten = \"nowhere\"\n{}",
            path.display(),
            MINIMAL
        );
        assert_eq!(
            errors_of(&text),
            [
                "exporter.listen: \"nowhere\" is not an address like 127.0.0.1:9464".to_owned(),
                format!(
                    "exporter.web_config: {}: (file): {kind}, not a regular file",
                    path.display()
                ),
            ]
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// What needs a dataset's prompts is checked once it is read: the length
/// it gives, the tokens a run may ask for, the endpoint of each target;
/// the concurrency levels of one scenario share one read.
#[test]
fn a_dataset_is_read_once_and_checked_in_the_load_step() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().to_path_buf();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\":\"one two three four five six seven\"}\n",
    )
    .unwrap();
    let chat = dir.join("chat.jsonl");
    std::fs::write(
        &chat,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}\n",
    )
    .unwrap();
    let fine = format!(
        "[[targets]]\nname = \"a\"\nbase_url = \"http://h:1\"\nscenarios = [\"d\", \"e\"]\n\
[[targets]]\nname = \"b\"\nbase_url = \"http://h:1\"\nendpoint = \"completions\"\n\
[[scenarios]]\nname = \"d\"\ndataset_path = \"{p}\"\npreset = \"concurrency-scaling\"\n\
[[scenarios]]\nname = \"e\"\ndataset_path = \"{p}\"\n",
        p = prompts.display()
    );
    let parsed = Config::parse(&fine, "t").unwrap_or_else(|e| panic!("{e}"));
    let e = parsed.scenario("e").unwrap();
    assert_eq!(
        (e.input_len, e.output_len),
        (scenarios::INPUT_LEN_FROM_DATASET, 128)
    );
    let c = parsed.load_files().unwrap_or_else(|e| panic!("{e}"));
    let e = c.scenario("e").unwrap();
    assert_eq!(
        (e.input_len, e.output_len),
        (9, 128),
        "estimated from the prompt"
    );
    let (c2, c32) = (c.scenario("d-c2").unwrap(), c.scenario("d-c32").unwrap());
    assert_eq!(c2.input_len, 1024, "the preset's");
    let shared = |s: &ScenarioConfig| s.dataset.as_ref().unwrap().get().clone();
    assert!(std::sync::Arc::ptr_eq(&shared(c2), &shared(c32)));
    assert!(!std::sync::Arc::ptr_eq(&shared(c2), &shared(e)));

    let text = format!(
        "{fine}[[scenarios]]\nname = \"c\"\ndataset_path = \"{}\"\n\
[[scenarios]]\nname = \"long\"\ndataset_path = \"{}\"\noutput_len = 1000000\nnum_requests = 100000\n",
        chat.display(),
        prompts.display()
    );
    let errors = errors_of(&text);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].starts_with("scenarios[3].input_len: "),
        "{errors:?}"
    );
    assert_eq!(
        errors[1],
        format!(
            "targets[1].scenarios: \"c\": {} line 1 has chat messages: use the chat endpoint",
            chat.display()
        )
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A replay's settings: a whole configuration as the daemon reads it, or
/// a file of a `[detector]` section alone; anything else beside it is
/// named.
#[test]
fn a_replay_takes_a_detector_section_alone_or_a_whole_configuration() {
    let (policy, drift) =
        Config::verdict_settings_from_text("[detector]\nsettled_tail_df = 7\n", "d.toml")
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.settled_tail_df, 7.0);
    assert!(drift.is_empty());

    let whole = format!(
        "{MINIMAL}[detector]\nupgrade_candidate_window = 24\n[[scenarios]]\nname = \"canary\"\nkind = \"drift\"\ninput_len = 8\noutput_len = 8\n"
    );
    let (policy, drift) =
        Config::verdict_settings_from_text(&whole, "c.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(policy.upgrade_candidate_window, 24);
    assert!(drift.contains("canary"), "{drift:?}");

    let err =
        Config::verdict_settings_from_text("[detector]\nsettled_tail_df = 2\n[notify]\n", "d.toml")
            .unwrap_err()
            .to_string();
    assert!(
        err.contains("detector.settled_tail_df: 2 is out of range"),
        "{err}"
    );
    assert!(err.contains("notify: unknown key"), "{err}");
    // A whole configuration is checked whole.
    let err = Config::verdict_settings_from_text("[[scenarios]]\nname = \"s\"\n", "c.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("targets"), "{err}");
}
