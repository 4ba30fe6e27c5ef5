//! Journal reader: arbitrary bytes as `journal.jsonl`, through `journal::parse` and
//! `journal::last_run`. The harness is `keyplan::fuzzing::journal_reader`, which
//! `tests/verification/fuzz_corpus.rs` replays over the committed corpus.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    keyplan::fuzzing::journal_reader(data);
});
