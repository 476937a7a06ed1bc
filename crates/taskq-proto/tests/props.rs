//! Property tests: the fast codec against naive references written here with
//! `String`s, `Vec`s and `split(' ')`, as memchr checks its routines.

use proptest::prelude::*;
use taskq_proto::yaml::{items, pairs};
use taskq_proto::{
    parse_reply, Command, CommandKind as K, JobStats, Limits, Reply, ServerStats, Status, TubeStats,
};

// ---------------------------------------------------------------- commands

/// A command that owns its tube and body, so a strategy can build it.
#[derive(Debug, Clone)]
struct Owned {
    which: u8,
    id: u64,
    a: u32,
    b: u32,
    c: u32,
    tube: String,
    body: Vec<u8>,
}

const COMMANDS: u8 = 25;

impl Owned {
    fn cmd(&self) -> Command<'_> {
        let (id, a, b, c, tube, body) = (
            self.id,
            self.a,
            self.b,
            self.c,
            self.tube.as_str(),
            &self.body[..],
        );
        match self.which {
            0 => Command::Put {
                pri: a,
                delay: b,
                ttr: c,
                body,
            },
            1 => Command::Use { tube },
            2 => Command::Reserve,
            3 => Command::ReserveWithTimeout { timeout: a },
            4 => Command::ReserveJob { id },
            5 => Command::Delete { id },
            6 => Command::Release {
                id,
                pri: a,
                delay: b,
            },
            7 => Command::Bury { id, pri: a },
            8 => Command::Touch { id },
            9 => Command::Watch { tube },
            10 => Command::Ignore { tube },
            11 => Command::Peek { id },
            12 => Command::PeekReady,
            13 => Command::PeekDelayed,
            14 => Command::PeekBuried,
            15 => Command::Kick { bound: a },
            16 => Command::KickJob { id },
            17 => Command::Stats,
            18 => Command::StatsJob { id },
            19 => Command::StatsTube { tube },
            20 => Command::ListTubes,
            21 => Command::ListTubeUsed,
            22 => Command::ListTubesWatched,
            23 => Command::PauseTube { tube, delay: a },
            _ => Command::Quit,
        }
    }

    /// The request as a naive client would write it down: name, arguments, body.
    fn naive(&self) -> NaiveRequest {
        let s = |x: &dyn ToString| x.to_string();
        let (name, args): (&str, Vec<String>) = match self.which {
            0 => (
                "put",
                vec![s(&self.a), s(&self.b), s(&self.c), s(&self.body.len())],
            ),
            1 => ("use", vec![self.tube.clone()]),
            2 => ("reserve", vec![]),
            3 => ("reserve-with-timeout", vec![s(&self.a)]),
            4 => ("reserve-job", vec![s(&self.id)]),
            5 => ("delete", vec![s(&self.id)]),
            6 => ("release", vec![s(&self.id), s(&self.a), s(&self.b)]),
            7 => ("bury", vec![s(&self.id), s(&self.a)]),
            8 => ("touch", vec![s(&self.id)]),
            9 => ("watch", vec![self.tube.clone()]),
            10 => ("ignore", vec![self.tube.clone()]),
            11 => ("peek", vec![s(&self.id)]),
            12 => ("peek-ready", vec![]),
            13 => ("peek-delayed", vec![]),
            14 => ("peek-buried", vec![]),
            15 => ("kick", vec![s(&self.a)]),
            16 => ("kick-job", vec![s(&self.id)]),
            17 => ("stats", vec![]),
            18 => ("stats-job", vec![s(&self.id)]),
            19 => ("stats-tube", vec![self.tube.clone()]),
            20 => ("list-tubes", vec![]),
            21 => ("list-tube-used", vec![]),
            22 => ("list-tubes-watched", vec![]),
            23 => ("pause-tube", vec![self.tube.clone(), s(&self.a)]),
            _ => ("quit", vec![]),
        };
        NaiveRequest {
            name: name.to_string(),
            args,
            body: (self.which == 0).then(|| self.body.clone()),
        }
    }
}

#[derive(Debug, PartialEq)]
struct NaiveRequest {
    name: String,
    args: Vec<String>,
    body: Option<Vec<u8>>,
}

/// Reads one request the slow way; `None` if the bytes are not exactly one request.
fn naive_parse_request(bytes: &[u8]) -> Option<NaiveRequest> {
    let eol = bytes.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8(bytes[..eol].to_vec()).ok()?;
    let mut words: Vec<String> = line.split(' ').map(String::from).collect();
    let name = words.remove(0);
    let rest = &bytes[eol + 2..];
    if name == "put" {
        let len: usize = words.get(3)?.parse().ok()?;
        let body = rest.get(..len)?.to_vec();
        if rest.get(len..)? != b"\r\n" {
            return None;
        }
        return Some(NaiveRequest {
            name,
            args: words,
            body: Some(body),
        });
    }
    rest.is_empty().then_some(NaiveRequest {
        name,
        args: words,
        body: None,
    })
}

fn tube() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+/;.$_()][A-Za-z0-9+/;.$_()-]{0,199}"
}

/// Bytes rich in CR, LF and NUL, which a body may hold and a parser must not read.
fn body(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![any::<u8>(), Just(b'\r'), Just(b'\n'), Just(0u8), Just(b' ')],
        0..max,
    )
}

fn owned() -> impl Strategy<Value = Owned> {
    (
        0..COMMANDS,
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        tube(),
        body(2000),
    )
        .prop_map(|(which, id, a, b, c, tube, body)| Owned {
            which,
            id,
            // reserve-with-timeout takes only what the server reads as signed 32-bit.
            a: if which == 3 {
                a & taskq_proto::MAX_RESERVE_TIMEOUT
            } else {
                a
            },
            b,
            c,
            tube,
            body,
        })
}

// ---------------------------------------------------------------- replies

/// The shapes a reply line can take.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Bare(&'static str),
    Number(&'static str),
    Tube(&'static str),
    Job(&'static str),
    Yaml,
}

const RWT: K = K::ReserveWithTimeout { timeout: 1 };

#[rustfmt::skip]
const REPLIES: &[(K, Shape)] = &[
    (K::Put, Shape::Number("INSERTED")), (K::Put, Shape::Number("BURIED")),
    (K::Put, Shape::Bare("EXPECTED_CRLF")), (K::Put, Shape::Bare("JOB_TOO_BIG")), (K::Put, Shape::Bare("DRAINING")),
    (K::Use, Shape::Tube("USING")), (K::ListTubeUsed, Shape::Tube("USING")),
    (K::Reserve, Shape::Job("RESERVED")), (K::Reserve, Shape::Bare("DEADLINE_SOON")),
    (RWT, Shape::Job("RESERVED")), (RWT, Shape::Bare("DEADLINE_SOON")), (RWT, Shape::Bare("TIMED_OUT")),
    (K::ReserveJob, Shape::Job("RESERVED")), (K::ReserveJob, Shape::Bare("NOT_FOUND")),
    (K::Delete, Shape::Bare("DELETED")), (K::Delete, Shape::Bare("NOT_FOUND")),
    (K::Release, Shape::Bare("RELEASED")), (K::Release, Shape::Bare("BURIED")), (K::Release, Shape::Bare("NOT_FOUND")),
    (K::Bury, Shape::Bare("BURIED")), (K::Bury, Shape::Bare("NOT_FOUND")),
    (K::Touch, Shape::Bare("TOUCHED")), (K::Touch, Shape::Bare("NOT_FOUND")),
    (K::Watch, Shape::Number("WATCHING")), (K::Ignore, Shape::Number("WATCHING")), (K::Ignore, Shape::Bare("NOT_IGNORED")),
    (K::Peek, Shape::Job("FOUND")), (K::Peek, Shape::Bare("NOT_FOUND")),
    (K::PeekReady, Shape::Job("FOUND")), (K::PeekDelayed, Shape::Job("FOUND")), (K::PeekBuried, Shape::Job("FOUND")),
    (K::Kick, Shape::Number("KICKED")), (K::KickJob, Shape::Bare("KICKED")), (K::KickJob, Shape::Bare("NOT_FOUND")),
    (K::Stats, Shape::Yaml), (K::StatsJob, Shape::Yaml), (K::StatsTube, Shape::Yaml),
    (K::ListTubes, Shape::Yaml), (K::ListTubesWatched, Shape::Yaml),
    (K::PauseTube, Shape::Bare("PAUSED")), (K::PauseTube, Shape::Bare("NOT_FOUND")),
    (K::Delete, Shape::Bare("OUT_OF_MEMORY")), (K::Put, Shape::Bare("INTERNAL_ERROR")),
    (K::Stats, Shape::Bare("BAD_FORMAT")), (K::Reserve, Shape::Bare("UNKNOWN_COMMAND")),
];

/// A reply as plain data: its word, its arguments as text, and its body.
#[derive(Debug, PartialEq, Clone)]
struct NaiveReply {
    word: String,
    args: Vec<String>,
    body: Option<Vec<u8>>,
}

fn render(shape: Shape, n: u64, tube: &str, body: &[u8]) -> (NaiveReply, Vec<u8>) {
    let (word, args, body) = match shape {
        Shape::Bare(w) => (w, vec![], None),
        Shape::Number(w) => (w, vec![n.to_string()], None),
        Shape::Tube(w) => (w, vec![tube.to_string()], None),
        Shape::Job(w) => (
            w,
            vec![n.to_string(), body.len().to_string()],
            Some(body.to_vec()),
        ),
        Shape::Yaml => ("OK", vec![body.len().to_string()], Some(body.to_vec())),
    };
    let mut bytes = std::iter::once(word.to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ")
        .into_bytes();
    bytes.extend_from_slice(b"\r\n");
    if let Some(b) = &body {
        bytes.extend_from_slice(b);
        bytes.extend_from_slice(b"\r\n");
    }
    (
        NaiveReply {
            word: word.to_string(),
            args,
            body,
        },
        bytes,
    )
}

/// Reads one reply the slow way: `None` while incomplete.
fn naive_parse_reply(input: &[u8]) -> Option<(NaiveReply, usize)> {
    let eol = input.windows(2).position(|w| w == b"\r\n")?;
    let line = String::from_utf8(input[..eol].to_vec()).unwrap();
    let mut words: Vec<String> = line.split(' ').map(String::from).collect();
    let word = words.remove(0);
    let framed_len = match word.as_str() {
        "RESERVED" | "FOUND" => Some(words[1].parse::<usize>().unwrap()),
        "OK" => Some(words[0].parse::<usize>().unwrap()),
        _ => None,
    };
    let mut used = eol + 2;
    let body = match framed_len {
        Some(len) => {
            let body = input.get(used..used + len)?.to_vec();
            used += len;
            assert_eq!(input.get(used..used + 2)?, b"\r\n");
            used += 2;
            Some(body)
        }
        None => None,
    };
    Some((
        NaiveReply {
            word,
            args: words,
            body,
        },
        used,
    ))
}

/// The fast parser's answer in the naive form.
fn as_naive(r: &Reply<'_>) -> NaiveReply {
    let (args, body): (Vec<String>, Option<&[u8]>) = match *r {
        Reply::Inserted { id } | Reply::InsertedBuried { id } => (vec![id.to_string()], None),
        Reply::Using { tube } => (vec![tube.to_string()], None),
        Reply::Reserved { id, body } | Reply::Found { id, body } => {
            (vec![id.to_string(), body.len().to_string()], Some(body))
        }
        Reply::Watching { count } | Reply::Kicked { count } => (vec![count.to_string()], None),
        Reply::Ok { yaml } => (vec![yaml.len().to_string()], Some(yaml)),
        _ => (vec![], None),
    };
    NaiveReply {
        word: r.word().to_string(),
        args,
        body: body.map(<[u8]>::to_vec),
    }
}

fn generated_reply() -> impl Strategy<Value = (K, NaiveReply, Vec<u8>)> {
    (0..REPLIES.len(), any::<u64>(), tube(), body(600)).prop_map(|(i, n, tube, body)| {
        let (kind, shape) = REPLIES[i];
        let (naive, bytes) = render(shape, n, &tube, &body);
        (kind, naive, bytes)
    })
}

const KINDS: &[K] = &K::ALL;

/// Inputs that often get past the first word, so deep paths are exercised.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    const WORDS: &[&str] = &[
        "INSERTED ",
        "BURIED ",
        "BURIED",
        "USING ",
        "RESERVED ",
        "FOUND ",
        "OK ",
        "WATCHING ",
        "KICKED ",
        "KICKED",
        "DELETED",
        "NOT_FOUND",
        "TIMED_OUT",
        "",
    ];
    (prop::sample::select(WORDS), body(300)).prop_map(|(w, rest)| {
        let mut v = w.as_bytes().to_vec();
        v.extend(rest);
        v
    })
}

/// Checks what must hold for any input: no panic, consumed within the input,
/// borrowed parts inside it, and the answer stable under cutting and re-parsing.
fn check_invariants(kind: K, input: &[u8]) -> Result<(), TestCaseError> {
    let limits = Limits {
        max_job_size: 256,
        max_yaml_size: 256,
    };
    let whole = parse_reply(kind, input, &limits);
    let range = input.as_ptr_range();
    if let Ok(Status::Complete(reply, used)) = whole {
        prop_assert!(used <= input.len());
        let part: Option<&[u8]> = match reply {
            Reply::Reserved { body, .. } | Reply::Found { body, .. } => Some(body),
            Reply::Ok { yaml } => Some(yaml),
            Reply::Using { tube } => Some(tube.as_bytes()),
            _ => None,
        };
        if let Some(p) = part {
            let r = p.as_ptr_range();
            prop_assert!(range.start <= r.start && r.end <= range.end);
            prop_assert!(r.end as usize <= range.start as usize + used);
        }
        prop_assert_eq!(parse_reply(kind, &input[..used], &limits), whole);
    }
    for cut in 0..input.len() {
        let p = parse_reply(kind, &input[..cut], &limits);
        match whole {
            Ok(Status::Complete(_, used)) if cut >= used => prop_assert_eq!(p, whole),
            _ => prop_assert!(
                p == Ok(Status::Partial) || p == whole,
                "cut {} gave {:?}, whole {:?}",
                cut,
                p,
                whole
            ),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- YAML

#[derive(Debug, Clone)]
struct Field {
    key: String,
    value: String,
    quote: Option<char>,
}

const TUBE_NUMBER_KEYS: &[&str] = &[
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
    "total-jobs",
    "current-using",
    "current-watching",
    "current-waiting",
    "cmd-delete",
    "cmd-pause-tube",
    "pause",
    "pause-time-left",
];

fn field() -> impl Strategy<Value = Field> {
    let known = (prop::sample::select(TUBE_NUMBER_KEYS), any::<u64>())
        .prop_map(|(k, n)| (k.to_string(), n.to_string()));
    let name = tube().prop_map(|t| ("name".to_string(), t));
    // Unknown keys carry any text a server might print, colons and `#` included.
    let unknown = (
        "x-[a-z-]{0,12}",
        "[A-Za-z0-9#./:_-]([A-Za-z0-9 #./:_-]{0,18}[A-Za-z0-9#./:_-])?",
    );
    (
        prop_oneof![known, name, unknown],
        prop::sample::select(vec![None, Some('"'), Some('\'')]),
    )
        .prop_map(|((key, value), quote)| Field { key, value, quote })
}

fn render_yaml(fields: &[Field], crlf: bool) -> Vec<u8> {
    let nl = if crlf { "\r\n" } else { "\n" };
    let mut s = format!("---{nl}");
    for f in fields {
        match f.quote {
            Some(q) => s += &format!("{}: {q}{}{q}{nl}", f.key, f.value),
            None => s += &format!("{}: {}{nl}", f.key, f.value),
        }
    }
    s.into_bytes()
}

/// The naive reading: split lines, split at the first ": ", strip quotes.
fn naive_yaml(doc: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8(doc.to_vec()).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            let v = v.trim();
            let v = if v.len() >= 2
                && (v.starts_with('"') && v.ends_with('"')
                    || v.starts_with('\'') && v.ends_with('\''))
            {
                &v[1..v.len() - 1]
            } else {
                v
            };
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// (a) Encoding any valid command and reading it back naively gives the request.
    #[test]
    fn encode_then_naive_parse(o in owned()) {
        let cmd = o.cmd();
        let mut buf = vec![0u8; 4096];
        let n = cmd.encode(&mut buf, 65535).unwrap();
        prop_assert_eq!(n, cmd.encoded_len());
        prop_assert!(buf[..n].windows(2).position(|w| w == b"\r\n").unwrap() + 2 <= taskq_proto::MAX_LINE);
        prop_assert_eq!(naive_parse_request(&buf[..n]), Some(o.naive()));
        prop_assert_eq!(cmd.kind().name(), o.naive().name);
    }

    /// (b) On generated replies the fast parser agrees with the naive one,
    /// whole, cut at random points, and with the next reply already behind it.
    #[test]
    fn replies_agree_with_naive(
        (kind, naive, bytes) in generated_reply(),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
        trailing in body(40),
    ) {
        let limits = Limits::default();
        let (expect, used) = naive_parse_reply(&bytes).unwrap();
        prop_assert_eq!(&expect, &naive);
        prop_assert_eq!(used, bytes.len());
        match parse_reply(kind, &bytes, &limits) {
            Ok(Status::Complete(r, n)) => {
                prop_assert_eq!(n, bytes.len());
                prop_assert_eq!(as_naive(&r), naive.clone());
            }
            other => prop_assert!(false, "{:?} gave {:?}", kind, other),
        }
        for cut in cuts {
            let cut = cut.index(bytes.len());
            prop_assert_eq!(parse_reply(kind, &bytes[..cut], &limits), Ok(Status::Partial));
            prop_assert!(naive_parse_reply(&bytes[..cut]).is_none());
        }
        let mut piped = bytes.clone();
        piped.extend_from_slice(&trailing);
        match parse_reply(kind, &piped, &limits) {
            Ok(Status::Complete(r, n)) => {
                prop_assert_eq!(n, bytes.len());
                prop_assert_eq!(as_naive(&r), naive);
            }
            other => prop_assert!(false, "{:?} gave {:?}", kind, other),
        }
    }

    /// (c) Arbitrary bytes, for every command, never panic and keep the invariants.
    #[test]
    fn arbitrary_bytes_keep_invariants(input in prop::collection::vec(any::<u8>(), 0..300)) {
        for kind in KINDS {
            check_invariants(*kind, &input)?;
        }
    }

    /// (c) The same for inputs that start with a real reply word.
    #[test]
    fn hostile_bytes_keep_invariants(input in hostile_bytes()) {
        for kind in KINDS {
            check_invariants(*kind, &input)?;
        }
    }

    /// (d) Generated stats documents read the same as the naive reading.
    #[test]
    fn yaml_agrees_with_naive(fields in prop::collection::vec(field(), 0..30), crlf in any::<bool>()) {
        let doc = render_yaml(&fields, crlf);
        let naive = naive_yaml(&doc);
        let fast: Vec<(String, String)> = pairs(&doc).unwrap()
            .map(|p| p.map(|(k, v)| (k.to_string(), v.to_string())))
            .collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(&fast, &naive);
        let t = TubeStats::parse(&doc).unwrap();
        let last = |key: &str| naive.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        let num = |key: &str| last(key).map_or(0, |v| v.parse::<u64>().unwrap());
        #[rustfmt::skip]
        let got = [t.current_jobs_urgent, t.current_jobs_ready, t.current_jobs_reserved, t.current_jobs_delayed,
            t.current_jobs_buried, t.total_jobs, t.current_using, t.current_watching, t.current_waiting,
            t.cmd_delete, t.cmd_pause_tube, t.pause, t.pause_time_left];
        for (key, value) in TUBE_NUMBER_KEYS.iter().zip(got) {
            prop_assert_eq!(value, num(key), "{}", key);
        }
        prop_assert_eq!(t.name.to_string(), last("name").unwrap_or_default());
    }

    /// (d) Lists read the same as the naive reading.
    #[test]
    fn yaml_lists_agree_with_naive(names in prop::collection::vec((tube(), any::<bool>()), 0..20)) {
        let mut doc = String::from("---\n");
        for (n, quoted) in &names {
            doc += &if *quoted { format!("- \"{n}\"\n") } else { format!("- {n}\n") };
        }
        let fast: Vec<&str> = items(doc.as_bytes()).unwrap().collect::<Result<_, _>>().unwrap();
        let naive: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
        prop_assert_eq!(fast, naive);
    }

    /// (c) Arbitrary bytes never panic the YAML readers, and what they return lies in the input.
    #[test]
    fn yaml_arbitrary_bytes(mut doc in body(400), header in any::<bool>()) {
        if header {
            doc.splice(0..0, b"---\n".iter().copied());
        }
        let range = doc.as_ptr_range();
        let inside = |s: &str| {
            let r = s.as_bytes().as_ptr_range();
            s.is_empty() || (range.start <= r.start && r.end <= range.end)
        };
        if let Ok(it) = pairs(&doc) {
            for (k, v) in it.flatten() {
                prop_assert!(inside(k) && inside(v));
            }
        }
        if let Ok(it) = items(&doc) {
            for i in it.flatten() {
                prop_assert!(inside(i));
            }
        }
        let _ = (ServerStats::parse(&doc), TubeStats::parse(&doc), JobStats::parse(&doc));
    }
}
