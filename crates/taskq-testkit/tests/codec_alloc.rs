//! The server side of the codec allocates nothing: parsing pipelined commands
//! (good and malformed) and encoding every kind of reply, under a counting
//! global allocator.

use taskq_proto::server::{encode_reply, parse_command, skip_line};
use taskq_proto::{Reply, Status};
use taskq_testkit::alloc::{self, CountingAllocator};

#[global_allocator]
static GLOBAL: CountingAllocator = CountingAllocator;

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

    let (written, allocations) = alloc::in_this_thread(|| {
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
        written
    });

    assert_eq!(allocations, 0);
    assert_eq!((commands, errors), (200 * 9, 200 * 4));
    assert!(written > 100 * 300);
}
