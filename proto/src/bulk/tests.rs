//! The data connection's frames: hellos, requests and replies round-trip
//! with their fields pinned, and bad ones are refused naming the field,
//! lengths bounded before anything is allocated.

use super::*;

fn hello() -> Hello {
    Hello {
        session: 0x1234_5678_9abc_def1,
        hold_from: 1 << 20,
        secret: [7; SECRET_BYTES],
    }
}

#[test]
fn a_hello_round_trips_and_its_fields_are_pinned() {
    let b = hello().encode();
    assert_eq!(&b[0..4], b"STRB");
    assert_eq!(u32_at(&b, 4), VERSION);
    assert_eq!(u64_at(&b, 8), 0x1234_5678_9abc_def1);
    assert_eq!(u64_at(&b, 16), 1 << 20);
    assert_eq!(&b[32..], &[7; SECRET_BYTES]);
    assert_eq!(Hello::decode(&b).unwrap(), hello());
    assert!(
        !format!("{:?}", hello()).contains("secret"),
        "no secret in Debug"
    );
}

#[test]
fn a_bad_hello_names_its_field() {
    let mut b = hello().encode();
    b[0] = b'G';
    assert!(matches!(Hello::decode(&b), Err(BulkError::Magic { .. })));
    let mut b = hello().encode();
    b[4] = 9;
    assert_eq!(Hello::decode(&b), Err(BulkError::Version { got: 9 }));
    let mut b = hello().encode();
    b[8..16].fill(0);
    assert!(
        Hello::decode(&b)
            .unwrap_err()
            .to_string()
            .starts_with("hello.session")
    );
    let mut b = hello().encode();
    b[24] = 1;
    assert!(
        Hello::decode(&b)
            .unwrap_err()
            .to_string()
            .starts_with("hello.reserved")
    );
    // Garbage: an HTTP request where a hello should be.
    let mut g = [0u8; HELLO_BYTES];
    g[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
    assert!(matches!(Hello::decode(&g), Err(BulkError::Magic { .. })));
}

#[test]
fn requests_round_trip_and_lengths_are_bounded_before_anything_is_allocated() {
    for r in [
        Request::Stage { id: 1, len: 1 },
        Request::Stage {
            id: u64::MAX,
            len: MAX_INLINE_EXTENT,
        },
        Request::Fetch { id: 9, max: 4096 },
    ] {
        assert_eq!(Request::decode(&r.encode()), Ok(r));
    }
    let e = Request::decode(&header(STAGE, 0, 1, MAX_INLINE_EXTENT + 1)).unwrap_err();
    assert!(
        matches!(
            e,
            BulkError::Length {
                field: "stage.len",
                ..
            }
        ),
        "{e}"
    );
    let e = Request::decode(&header(STAGE, 0, 1, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            BulkError::Length {
                field: "stage.len",
                ..
            }
        ),
        "{e}"
    );
    let e = Request::decode(&header(FETCH, 0, 1, u64::MAX)).unwrap_err();
    assert!(
        matches!(
            e,
            BulkError::Length {
                field: "fetch.max",
                ..
            }
        ),
        "{e}"
    );
    let e = Request::decode(&header(STAGE, 0, 0, 8)).unwrap_err();
    assert_eq!(e, BulkError::ZeroId { field: "stage.id" });
    let e = Request::decode(&header(FETCH, 0, 0, 8)).unwrap_err();
    assert_eq!(e, BulkError::ZeroId { field: "fetch.id" });
    let e = Request::decode(&header(STAGE, 3, 1, 8)).unwrap_err();
    assert!(matches!(
        e,
        BulkError::NotZero {
            field: "request.code",
            got: 3
        }
    ));
    let e = Request::decode(&header(77, 0, 1, 8)).unwrap_err();
    assert_eq!(
        e,
        BulkError::Kind {
            frame: "request",
            got: 77
        }
    );
    // A reply sent where a request belongs is not a request.
    assert!(Request::decode(&Reply::Ok { id: 1 }.encode()).is_err());
}

#[test]
fn replies_round_trip_and_are_checked_too() {
    for r in [
        Reply::Ok { id: 4 },
        Reply::Data { id: 4, len: 0 },
        Reply::Data {
            id: 4,
            len: MAX_INLINE_EXTENT,
        },
        Reply::Refused {
            code: RefusalCode::Exhausted,
            id: 4,
            len: 12,
        },
    ] {
        assert_eq!(Reply::decode(&r.encode()), Ok(r));
    }
    assert!(Reply::decode(&header(DATA, 0, 1, MAX_INLINE_EXTENT + 1)).is_err());
    assert!(Reply::decode(&header(REFUSED, 0, 1, 1)).is_err(), "code 0");
    assert!(Reply::decode(&header(REFUSED, 9, 1, 1)).is_err(), "code 9");
    assert!(
        Reply::decode(&header(REFUSED, 1, 1, MAX_REASON_BYTES as u64 + 1)).is_err(),
        "reason too long"
    );
    assert!(
        Reply::decode(&header(OK, 0, 1, 5)).is_err(),
        "ok with a body"
    );
    assert!(Reply::decode(&header(STAGE, 0, 1, 5)).is_err());
}

#[test]
fn a_refusal_carries_its_reason_cut_on_a_character_boundary() {
    let f = refusal(RefusalCode::NotFound, 3, "no held bytes 3");
    let (h, reason) = f.split_at(HEADER_BYTES);
    assert_eq!(
        Reply::decode(h.try_into().unwrap()),
        Ok(Reply::Refused {
            code: RefusalCode::NotFound,
            id: 3,
            len: 15
        })
    );
    assert_eq!(reason, b"no held bytes 3");
    let long = "é".repeat(MAX_REASON_BYTES);
    let f = refusal(RefusalCode::Invalid, 1, &long);
    assert!(f.len() - HEADER_BYTES <= MAX_REASON_BYTES);
    assert!(std::str::from_utf8(&f[HEADER_BYTES..]).is_ok());
}
