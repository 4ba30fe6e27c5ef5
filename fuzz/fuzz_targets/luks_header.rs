//! LUKS header reader: arbitrary bytes as the start of a device, through
//! `luks::ondisk::parse`. The harness is `keyplan::fuzzing::luks_header`, which
//! `tests/verification/fuzz_corpus.rs` replays over the committed corpus (headers keyplan's tests make, and
//! damaged copies of them).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    keyplan::fuzzing::luks_header(data);
});
