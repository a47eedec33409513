//! The exchange decoder on arbitrary bytes: whatever a peer sends, `decode` and `decode_header`
//! return a value or an error, never panic; whatever decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdma_demo::exchange::{HEADER_LEN, decode, decode_body, decode_header, encode};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = data.first_chunk::<HEADER_LEN>()
        && let Ok(len) = decode_header(h)
    {
        assert!(len <= rdma_demo::exchange::MAX_BODY_LEN);
    }
    let _ = decode_body(data);
    if let Ok(info) = decode(data) {
        let again = encode(&info);
        assert_eq!(again, data, "a decoded message re-encodes to its own bytes");
        assert_eq!(decode(&again), Ok(info));
    }
});
