//! The checks on the task log can fail: hand-made logs that break each rule.

use super::*;

#[test]
fn the_log_parser_pairs_ends_with_starts_and_keeps_task_names_whole() {
    let text = "start c1 nova_compute pre-1 v2 10 100.5 RPC pin nova-compute\n\
                start c1 puppet puppet v1 11 99.0 puppet\n\
                garbage line\n\
                end c1 nova_compute pre-1 v2 10 101.25 RPC pin nova-compute\n\
                start c2 nova_compute finalize v2 12 102 unpin RPC\n";
    let runs = parse_log(text);
    assert_eq!(runs.len(), 3, "{runs:#?}");
    assert_eq!(runs[0].phase, Phase::Puppet);
    assert_eq!(runs[1].task, "RPC pin nova-compute");
    assert_eq!(runs[1].end, Some(101.25));
    assert_eq!(runs[2].phase, Phase::Finalize);
    assert_eq!(runs[2].end, None);
    assert_eq!(of_version(&runs, "v2").len(), 2);
    assert!(Phase::Pre(9) < Phase::Puppet && Phase::Puppet < Phase::Post(1));
    assert!(Phase::Post(4) < Phase::Finalize && Phase::Pre(1) < Phase::Pre(2));
    assert_eq!(Phase::parse("pre-0"), None);
    assert_eq!(Phase::parse("post-3"), Some(Phase::Post(3)));
}

#[test]
fn the_lockstep_check_catches_a_step_started_before_another_host_finished() {
    let hosts = set(&["c1", "c2"]);
    let ok = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "n", "pre-1", 2, 1.5, Some(3.0), "a"),
        ("c1", "n", "pre-2", 3, 3.1, Some(4.0), "b"),
        ("c2", "puppet", "puppet", 4, 4.1, Some(5.0), "puppet"),
        ("c1", "puppet", "puppet", 5, 4.2, Some(5.5), "puppet"),
        ("c2", "n", "post-3", 6, 5.6, Some(6.0), "c"),
    ]));
    assert_eq!(lockstep_violations(&ok, &hosts), Vec::<String>::new());
    // c1 starts step 2 while c2 still runs step 1.
    let early = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "n", "pre-1", 2, 1.5, Some(3.0), "a"),
        ("c1", "n", "pre-2", 3, 2.5, Some(4.0), "b"),
    ]));
    let v = lockstep_violations(&early, &hosts);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(
        v[0].contains("c1 n/pre-2") && v[0].contains("c2 n/pre-1"),
        "{v:#?}"
    );
    // Puppet starting while a post step runs elsewhere is just as wrong.
    let puppet_late = parse_log(&log(&[
        ("c1", "puppet", "puppet", 1, 1.0, Some(3.0), "puppet"),
        ("c2", "n", "post-1", 2, 2.0, Some(4.0), "c"),
    ]));
    assert_eq!(lockstep_violations(&puppet_late, &hosts).len(), 1);
    // A run that never ended blocks every later phase, unless it was run again.
    let open = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, None, "a"),
        ("c2", "n", "pre-2", 2, 5.0, Some(6.0), "b"),
    ]));
    assert_eq!(lockstep_violations(&open, &hosts).len(), 1);
    let rerun = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, None, "a"),
        ("c1", "n", "pre-1", 7, 3.0, Some(4.0), "a"),
        ("c2", "n", "pre-2", 2, 5.0, Some(6.0), "b"),
    ]));
    assert_eq!(lockstep_violations(&rerun, &hosts), Vec::<String>::new());
    // Hosts of another stage are not this stage's business.
    assert_eq!(lockstep_violations(&early, &set(&["c1"])), Vec::<String>::new());
}

#[test]
fn the_overlap_counts_hosts_in_a_phase_not_tasks() {
    let runs = parse_log(&log(&[
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c1", "m", "pre-1", 2, 2.0, Some(3.0), "b"),
        ("c2", "n", "pre-1", 3, 2.5, Some(3.5), "a"),
        ("c3", "n", "pre-1", 4, 2.9, Some(4.0), "a"),
        ("c4", "n", "pre-2", 5, 2.9, Some(4.0), "a"),
    ]));
    let (n, at) = max_overlap(&runs, &set(&["c1", "c2", "c3", "c4"]), Phase::Pre(1));
    assert_eq!(n, 3, "{at:?}");
    let (n, _) = max_overlap(&runs, &set(&["c1", "c2"]), Phase::Pre(1));
    assert_eq!(n, 2);
}

#[test]
fn the_dependency_and_order_checks_catch_an_early_dependent() {
    // api1's nova_api step 1 starts while keystone's step 1 still runs on id2.
    let runs = parse_log(&log(&[
        ("id1", "keystone", "pre-1", 1, 1.0, Some(2.0), "k"),
        ("id2", "keystone", "pre-1", 2, 1.0, Some(4.0), "k"),
        ("api1", "nova_api", "pre-1", 3, 3.0, Some(5.0), "n"),
        ("api1", "nova_api", "post-3", 4, 6.0, Some(7.0), "n3"),
    ]));
    let v = after_violations(&runs, "nova_api", "keystone");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(v[0].contains("api1") && v[0].contains("id2"), "{v:#?}");
    // On one host: nova_api overlapping keystone, and tasks out of file order.
    let runs = parse_log(&log(&[
        ("c1", "keystone", "pre-1", 1, 1.0, Some(2.0), "k2"),
        ("c1", "keystone", "pre-1", 2, 2.0, Some(3.0), "k1"),
        ("c1", "nova_api", "pre-1", 3, 2.5, Some(4.0), "n"),
    ]));
    let want = [("keystone", "k1"), ("keystone", "k2"), ("nova_api", "n")];
    let v = sequence_violations(&runs, "c1", Phase::Pre(1), &want);
    assert_eq!(v.len(), 2, "{v:#?}");
    let good = [("keystone", "k2"), ("keystone", "k1"), ("nova_api", "n")];
    assert_eq!(sequence_violations(&runs, "c1", Phase::Pre(1), &good).len(), 1);
}

#[test]
fn the_finalize_check_catches_a_second_run_an_early_one_and_a_wrong_host() {
    let base = [
        ("c1", "n", "pre-1", 1, 1.0, Some(2.0), "a"),
        ("c2", "puppet", "puppet", 2, 2.5, Some(5.0), "puppet"),
    ];
    let want = [("n", "unpin")];
    let mut ok = base.to_vec();
    ok.push(("c1", "n", "finalize", 3, 6.0, Some(7.0), "unpin"));
    assert_eq!(
        finalize_violations(&parse_log(&log(&ok)), "c1", &want),
        Vec::<String>::new()
    );
    let mut twice = ok.clone();
    twice.push(("c2", "n", "finalize", 4, 8.0, Some(9.0), "unpin"));
    let v = finalize_violations(&parse_log(&log(&twice)), "c1", &want);
    assert_eq!(v.len(), 2, "twice, and once on c2: {v:#?}");
    let mut early = base.to_vec();
    early.push(("c1", "n", "finalize", 3, 4.0, Some(4.5), "unpin"));
    let v = finalize_violations(&parse_log(&log(&early)), "c1", &want);
    assert_eq!(v.len(), 1, "before c2's Puppet ended: {v:#?}");
    let v = finalize_violations(&parse_log(&log(&base)), "c1", &want);
    assert_eq!(v.len(), 1, "never ran: {v:#?}");
    // Stages: the second may not start before the first ended.
    let runs = parse_log(&log(&base));
    assert_eq!(
        stage_order_violations(&runs, &set(&["c1"]), &set(&["c2"])),
        Vec::<String>::new()
    );
    assert_eq!(
        stage_order_violations(&runs, &set(&["c2"]), &set(&["c1"])).len(),
        1
    );
}
