//! The checks on the action's log can fail: hand-made logs that break each rule.

use super::*;

#[test]
fn the_log_checks_can_fail() {
    let log = "start compute1 c1 1.0 x\n\
               start compute2 c1 1.5 x\n\
               start compute1 v2 1.8\n\
               end compute1 c1 2.0\n\
               end compute2 c1 3.0\n\
               end compute1 v2 4.0\n\
               start compute2 c1 5.0 x\n";
    let runs = parse_log(log);
    assert_eq!(runs.len(), 4);
    assert_eq!(max_overlap(&runs).0, 3);
    assert_eq!(same_host_overlaps(&runs).len(), 1);
    assert_eq!(repeated(&runs, "c1"), ["compute2"]);
    assert!(runs[3].end.is_none());
    // A log that keeps every rule.
    let ok = parse_log("start a c1 1 x\nend a c1 2\nstart b c1 2.5 x\nend b c1 3\n");
    assert_eq!(max_overlap(&ok).0, 1);
    assert!(same_host_overlaps(&ok).is_empty());
    assert!(repeated(&ok, "c1").is_empty());
}
