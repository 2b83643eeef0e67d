//! The packet format between NICs (little-endian, over a Unix stream): a 12-byte frame header
//! (magic, kind, body length), then a request (one whole message of a work request, with its
//! PSN and packet count) or a response (ACK or NAK of one request). Everything read is checked
//! before use: a malformed frame closes the connection.

use std::io::{self, Read};

use crate::device::{NodeAddr, MAX_MSG};
use crate::sys::{WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM, WR_SEND, WR_SEND_WITH_IMM};

const MAGIC: u32 = 0x5642_4954;
const KIND_REQUEST: u8 = 1;
const KIND_RESPONSE: u8 = 2;
const HEADER: usize = 12;
const REQUEST_FIXED: usize = 40;
const RESPONSE_LEN: usize = 10;
pub const PSN_MASK: u32 = 0xff_ffff;

/// A request packet: one message (of `npkts` MTU-sized packets on a real link).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub src: NodeAddr,
    pub dst_dev: u8,
    /// `WR_RDMA_WRITE`, `WR_RDMA_WRITE_WITH_IMM`, `WR_SEND` or `WR_SEND_WITH_IMM`.
    pub opcode: u32,
    pub src_qpn: u32,
    pub dst_qpn: u32,
    pub psn: u32,
    pub npkts: u32,
    /// `imm_data` exactly as the work request held it (big-endian by convention).
    pub imm: [u8; 4],
    pub rkey: u32,
    pub remote_addr: u64,
    pub payload: Vec<u8>,
}

/// A response's syndrome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    Ack,
    /// Receiver not ready: no receive posted; retry after the responder's min_rnr_timer.
    RnrNak,
    /// PSN ahead of the expected one.
    SeqNak,
    /// Remote access error (rkey, bounds, rights).
    AccessNak,
    /// Remote invalid request (a send longer than the receive buffers).
    InvReqNak,
    /// Remote operation error (the responder could not write its receive buffers).
    OpNak,
}

impl Syndrome {
    fn code(self) -> u8 {
        match self {
            Syndrome::Ack => 0,
            Syndrome::RnrNak => 1,
            Syndrome::SeqNak => 2,
            Syndrome::AccessNak => 3,
            Syndrome::InvReqNak => 4,
            Syndrome::OpNak => 5,
        }
    }

    fn from_code(c: u8) -> Option<Syndrome> {
        Some(match c {
            0 => Syndrome::Ack,
            1 => Syndrome::RnrNak,
            2 => Syndrome::SeqNak,
            3 => Syndrome::AccessNak,
            4 => Syndrome::InvReqNak,
            5 => Syndrome::OpNak,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Response {
    /// The requester's QP.
    pub qpn: u32,
    pub psn: u32,
    pub syndrome: Syndrome,
    /// The responder's min_rnr_timer (RNR NAK only).
    pub rnr_timer: u8,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    Request(Request),
    Response(Response),
}

fn header(kind: u8, body: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER + body);
    v.extend_from_slice(&MAGIC.to_le_bytes());
    v.extend_from_slice(&[kind, 0, 0, 0]);
    v.extend_from_slice(&(body as u32).to_le_bytes());
    v
}

/// The frame of a request up to its payload (which follows it on the wire).
pub fn encode_request_head(r: &Request) -> Vec<u8> {
    let mut v = header(KIND_REQUEST, REQUEST_FIXED + r.payload.len());
    v.extend_from_slice(&r.src.key.to_le_bytes());
    v.extend_from_slice(&[r.src.dev, r.dst_dev, r.opcode as u8, 0]);
    for x in [r.src_qpn, r.dst_qpn, r.psn, r.npkts] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.extend_from_slice(&r.imm);
    v.extend_from_slice(&r.rkey.to_le_bytes());
    v.extend_from_slice(&r.remote_addr.to_le_bytes());
    v
}

#[cfg(test)]
fn encode_request(r: &Request) -> Vec<u8> {
    let mut v = encode_request_head(r);
    v.extend_from_slice(&r.payload);
    v
}

pub fn encode_response(r: &Response) -> Vec<u8> {
    let mut v = header(KIND_RESPONSE, RESPONSE_LEN);
    v.extend_from_slice(&r.qpn.to_le_bytes());
    v.extend_from_slice(&r.psn.to_le_bytes());
    v.extend_from_slice(&[r.syndrome.code(), r.rnr_timer]);
    v
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads one frame; an error (end of stream included) means the connection is done.
pub fn read_frame(r: &mut impl Read) -> io::Result<Frame> {
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    if u32_at(&h, 0) != MAGIC {
        return Err(invalid("bad magic"));
    }
    let body = u32_at(&h, 8) as usize;
    match h[4] {
        KIND_RESPONSE => {
            if body != RESPONSE_LEN {
                return Err(invalid("bad response length"));
            }
            let mut b = [0u8; RESPONSE_LEN];
            r.read_exact(&mut b)?;
            let syndrome = Syndrome::from_code(b[8]).ok_or_else(|| invalid("bad syndrome"))?;
            let (qpn, psn) = (u32_at(&b, 0), u32_at(&b, 4));
            if psn > PSN_MASK || b[9] > 31 {
                return Err(invalid("bad response fields"));
            }
            Ok(Frame::Response(Response { qpn, psn, syndrome, rnr_timer: b[9] }))
        }
        KIND_REQUEST => {
            if !(REQUEST_FIXED..=REQUEST_FIXED + MAX_MSG as usize).contains(&body) {
                return Err(invalid("bad request length"));
            }
            let mut f = [0u8; REQUEST_FIXED];
            r.read_exact(&mut f)?;
            let opcode = u32::from(f[6]);
            if ![WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM, WR_SEND, WR_SEND_WITH_IMM].contains(&opcode) {
                return Err(invalid("bad opcode"));
            }
            let (psn, npkts) = (u32_at(&f, 16), u32_at(&f, 20));
            if psn > PSN_MASK || npkts == 0 || npkts > PSN_MASK / 2 {
                return Err(invalid("bad PSN or packet count"));
            }
            let mut payload = vec![0u8; body - REQUEST_FIXED];
            r.read_exact(&mut payload)?;
            Ok(Frame::Request(Request {
                src: NodeAddr { key: u32_at(&f, 0), dev: f[4] },
                dst_dev: f[5],
                opcode,
                src_qpn: u32_at(&f, 8),
                dst_qpn: u32_at(&f, 12),
                psn,
                npkts,
                imm: [f[24], f[25], f[26], f[27]],
                rkey: u32_at(&f, 28),
                remote_addr: u64::from_le_bytes([f[32], f[33], f[34], f[35], f[36], f[37], f[38], f[39]]),
                payload,
            }))
        }
        _ => Err(invalid("bad frame kind")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_refused() {
        let req = Request {
            src: NodeAddr { key: 77, dev: 1 },
            dst_dev: 0,
            opcode: WR_RDMA_WRITE_WITH_IMM,
            src_qpn: 0x123,
            dst_qpn: 0x456,
            psn: 0xff_fffe,
            npkts: 3,
            imm: [1, 2, 3, 4],
            rkey: 0xdead_beef,
            remote_addr: 0x7fff_0000_1234,
            payload: vec![9; 100],
        };
        let bytes = encode_request(&req);
        assert_eq!(read_frame(&mut &bytes[..]).unwrap(), Frame::Request(req));
        let resp = Response { qpn: 5, psn: 6, syndrome: Syndrome::RnrNak, rnr_timer: 12 };
        assert_eq!(read_frame(&mut &encode_response(&resp)[..]).unwrap(), Frame::Response(resp));

        let mut bad = bytes.clone();
        bad[0] ^= 1;
        assert!(read_frame(&mut &bad[..]).is_err());
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_frame(&mut &huge[..]).is_err());
        let mut opcode = bytes;
        opcode[HEADER + 6] = 4; // RDMA READ
        assert!(read_frame(&mut &opcode[..]).is_err());
        assert!(read_frame(&mut &[0u8; 5][..]).is_err());
    }
}
