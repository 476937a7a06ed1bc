//! Smoke test of the protocol core against a real beanstalkd.
use taskq_proto::{Command, Connection, ConnectionConfig, Reply};
use taskq_testkit::Beanstalkd;

#[test]
fn put_reserve_delete_round_trip() {
    let server = Beanstalkd::start().unwrap();
    let mut c = Connection::connect(server.addr(), ConnectionConfig::default()).unwrap();
    let body = b"a\r\nb\0c";
    let id = match c
        .request(&Command::Put {
            pri: 1,
            delay: 0,
            ttr: 10,
            body,
        })
        .unwrap()
    {
        Reply::Inserted { id } => id,
        r => panic!("{r:?}"),
    };
    match c
        .request(&Command::ReserveWithTimeout { timeout: 0 })
        .unwrap()
    {
        Reply::Reserved { id: got, body: b } => {
            assert_eq!(got, id);
            assert_eq!(b, body);
        }
        r => panic!("{r:?}"),
    }
    assert_eq!(c.request(&Command::Delete { id }).unwrap(), Reply::Deleted);
    assert_eq!(c.request(&Command::Delete { id }).unwrap(), Reply::NotFound);
    assert_eq!(
        c.request(&Command::ReserveWithTimeout { timeout: 0 })
            .unwrap(),
        Reply::TimedOut
    );
    let big = vec![7u8; 5000];
    assert!(matches!(
        c.request(&Command::Put {
            pri: 1,
            delay: 0,
            ttr: 10,
            body: &big
        })
        .unwrap(),
        Reply::Inserted { .. }
    ));
    match c.request(&Command::Stats).unwrap() {
        Reply::Ok { yaml } => {
            let s = taskq_proto::ServerStats::parse(yaml).unwrap();
            assert_eq!(s.cmd_put, 2);
            assert_eq!(s.cmd_delete, 2);
        }
        r => panic!("{r:?}"),
    }
}
