//! The server side of the codec allocates nothing: parsing pipelined commands
//! (good and malformed) and encoding every kind of reply, under a counting
//! global allocator.
// A global allocator can only be written with `unsafe`; it forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use taskq_proto::server::{encode_reply, parse_command, skip_line};
use taskq_proto::{Reply, Status};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged;
// the bookkeeping touches only an atomic and a const thread-local.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn parsing_and_encoding_allocate_nothing() {
    let mut stream = Vec::new();
    for i in 0..200 {
        stream.extend_from_slice(format!("put {i} 0 60 5\r\nab\r\nc\r\n").as_bytes());
        stream
            .extend_from_slice(b"reserve-with-timeout 5\r\ndelete 18\r\nuse tube-a\r\nwatch b\r\n");
        stream
            .extend_from_slice(b"release 1 2 3\r\nkick -1\r\npause-tube x 9\r\nstats\r\nfrob\r\n");
        stream.extend_from_slice(b"delete x\r\nput 1 2 3 999999\r\nput 0 0 1 1\r\nxYZ");
    }
    let body = [b'z'; 300];
    let replies = [
        Reply::Inserted { id: u64::MAX },
        Reply::Reserved { id: 7, body: &body },
        Reply::Using { tube: "default" },
        Reply::Ok {
            yaml: b"---\na: 1\n",
        },
        Reply::Kicked { count: 3 },
        Reply::NotFound,
    ];
    let mut out = [0u8; 1024];
    let mut commands = 0;
    let mut errors = 0;

    COUNTING.with(|c| c.set(true));
    let mut at = 0;
    while at < stream.len() {
        match parse_command(&stream[at..], 1000) {
            Ok(Status::Complete(_, n)) => {
                commands += 1;
                at += n;
            }
            Ok(Status::Partial) => break,
            Err(e) => {
                errors += 1;
                at += e.consumed();
            }
        }
    }
    let _ = skip_line(&stream);
    let mut written = 0;
    for _ in 0..100 {
        for r in &replies {
            written += encode_reply(r, &mut out).unwrap();
        }
    }
    COUNTING.with(|c| c.set(false));

    assert_eq!(ALLOCATIONS.load(Ordering::Relaxed), 0);
    assert_eq!((commands, errors), (200 * 9, 200 * 4));
    assert!(written > 100 * 300);
}
