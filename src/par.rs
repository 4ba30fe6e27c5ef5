//! A bounded parallel map on scoped threads, for work that mostly waits on child processes
//! (reading LUKS headers with cryptsetup).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Applies `f` to every item of `items` on at most `workers` threads (at least 1) and returns
/// the results in the order of `items`, whatever order they finished in. Items are handed out
/// one at a time, so a slow item does not hold up a whole share.
///
/// Errors: none of its own; a panic in `f` propagates to the caller when the threads are
/// joined (as `std::thread::scope` does).
pub fn map<T, R, F>(items: &[T], workers: usize, f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let workers = workers.clamp(1, items.len().max(1));
    if workers == 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                let mut all = results.lock().unwrap_or_else(|p| p.into_inner());
                all[i] = Some(r);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order_and_bounds_threads() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let items: Vec<u64> = (0..200).collect();
        let now = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let out = super::map(&items, 3, |x| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(200 - x));
            now.fetch_sub(1, Ordering::SeqCst);
            x * 2
        });
        assert_eq!(out, items.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert!(most.load(Ordering::SeqCst) >= 2, "ran on one thread only");
        assert_eq!(super::map(&Vec::<u8>::new(), 4, |x| *x), Vec::<u8>::new());
    }
}
