//! Multi-turn chat: conversations of K turns, each turn sent after the
//! previous answer arrived, with the history so far (the user's turns and
//! the model's answers). Conversations run side by side up to the
//! concurrency; a turn that fails ends its conversation.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tokio_util::task::AbortOnDropHandle;

use super::{OnComplete, RunOutput, ServerLost};
use crate::client::{ChatMessage, PreparedRequest, RequestRecord, StreamingClient};

/// Sends `conversations` (each its turns' user messages, in order), at
/// most `concurrency` at once. The client must keep the answer text.
pub async fn run(
    client: &StreamingClient,
    conversations: Vec<Vec<PreparedRequest>>,
    concurrency: usize,
    on_complete: Option<OnComplete>,
) -> RunOutput {
    let conversations = Arc::new(conversations);
    let next = Arc::new(AtomicUsize::new(0));
    let lost = ServerLost::default();
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1).min(conversations.len()))
        .map(|_| {
            let (client, conversations, next, on_complete, lost) = (
                client.clone(),
                conversations.clone(),
                next.clone(),
                on_complete.clone(),
                lost.clone(),
            );
            AbortOnDropHandle::new(tokio::spawn(async move {
                let mut done = Vec::new();
                while !lost.lost() {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(turns) = conversations.get(i) else {
                        break;
                    };
                    converse(&client, turns, &lost, on_complete.as_ref(), &mut done).await;
                }
                done
            }))
        })
        .collect();
    let mut records = Vec::new();
    for worker in workers {
        if let Ok(done) = worker.await {
            records.extend(done);
        }
    }
    records.sort_by_key(|r| r.index);
    let finished = records.iter().map(|r| r.end).max().unwrap_or(started);
    RunOutput {
        records,
        started,
        finished,
    }
}

/// One conversation, turn by turn.
async fn converse(
    client: &StreamingClient,
    turns: &[PreparedRequest],
    lost: &ServerLost,
    on_complete: Option<&OnComplete>,
    done: &mut Vec<RequestRecord>,
) {
    let mut history: Vec<ChatMessage> = Vec::with_capacity(turns.len() * 2);
    for turn in turns {
        history.push(ChatMessage {
            role: "user".into(),
            content: turn.prompt.clone(),
        });
        let request = PreparedRequest {
            messages: Some(history.clone()),
            ..turn.clone()
        };
        let mut record = client.send(&request, None).await;
        lost.note(&record);
        if let Some(f) = on_complete {
            f(&record);
        }
        let answer = record
            .output
            .take()
            .map(|o| o.text)
            .filter(|_| record.outcome.is_ok());
        done.push(record);
        // A failed turn has no answer to go on from.
        let Some(answer) = answer else { break };
        history.push(ChatMessage {
            role: "assistant".into(),
            content: answer,
        });
        if lost.lost() {
            break;
        }
    }
}
