//! A global allocator wrapper for tests and fuzz targets that measures the largest single
//! allocation a piece of code makes, so "no allocation beyond what the input justifies" can be
//! asserted. Nothing uses it unless a test binary installs it:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: courier_shared::alloc_probe::Tracking = courier_shared::alloc_probe::Tracking;
//! let (out, largest) = courier_shared::alloc_probe::largest_alloc(|| parse(input));
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, noting allocation sizes on the current thread while armed.
pub struct Tracking;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    let _ = ARMED.try_with(|a| {
        if a.get() {
            let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
        }
    });
}

/// Runs `f` and returns its result with the largest single allocation it made on this thread
/// (0 unless [`Tracking`] is the global allocator).
pub fn largest_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(0));
    ARMED.with(|a| a.set(true));
    let out = f();
    ARMED.with(|a| a.set(false));
    (out, LARGEST.with(|l| l.get()))
}
