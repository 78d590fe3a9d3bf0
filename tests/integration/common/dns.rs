//! A DNS server on 127.0.0.1 whose A records the test changes at will:
//! every A question gets the current addresses with a zero TTL, every
//! other question an empty answer; `fail` makes it answer SERVFAIL.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::rdata::A;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;

pub struct DnsServer {
    pub addr: SocketAddr,
    answers: Arc<Mutex<Option<Vec<Ipv4Addr>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl DnsServer {
    pub async fn start(answers: &[Ipv4Addr]) -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let current = Arc::new(Mutex::new(Some(answers.to_vec())));
        let shared = current.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let answers = shared.lock().unwrap().clone();
                let reply = answer(&query, answers.as_deref());
                let _ = socket.send_to(&reply.to_vec().unwrap(), from).await;
            }
        });
        DnsServer {
            addr,
            answers: current,
            task,
        }
    }

    /// The A records served from now on.
    pub fn set(&self, answers: &[Ipv4Addr]) {
        *self.answers.lock().unwrap() = Some(answers.to_vec());
    }

    /// Every question gets SERVFAIL from now on.
    pub fn fail(&self) {
        *self.answers.lock().unwrap() = None;
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(query: &Message, answers: Option<&[Ipv4Addr]>) -> Message {
    let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    for q in &query.queries {
        reply.add_query(q.clone());
        let Some(answers) = answers else {
            reply.metadata.response_code = ResponseCode::ServFail;
            continue;
        };
        if q.query_type() == RecordType::A {
            for ip in answers {
                reply.add_answer(Record::from_rdata(q.name().clone(), 0, RData::A(A(*ip))));
            }
        }
    }
    reply
}
