//! The drift canary's answers in the store: each run's greedy tokens and
//! their log-probabilities per prompt, and the latest answers of a build
//! or of the build before it.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Store, StoreError};
use crate::store::baselines::PairKey;
use crate::vocabulary::answers::Answer;

pub(super) fn insert(conn: &Connection, run_id: i64, answers: &[Answer]) -> Result<(), StoreError> {
    let mut insert = conn.prepare(
        "INSERT INTO answers (run_id, prompt, tokens, logprobs) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for a in answers {
        // NaN (a server that sent no log-probability) is stored as null.
        let logprobs: Vec<Option<f64>> = a
            .logprobs
            .iter()
            .map(|l| l.is_finite().then_some(*l))
            .collect();
        insert.execute(params![
            run_id,
            a.prompt as i64,
            serde_json::to_string(&a.tokens)?,
            serde_json::to_string(&logprobs)?,
        ])?;
    }
    Ok(())
}

/// Whose answers to look for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswersOf<'a> {
    /// The build's own, from an earlier run.
    Build(&'a str),
    /// The latest of any other build: the one served before.
    OtherThan(&'a str),
}

impl Store {
    /// The pair's latest answers from before run `before`, of a build or
    /// of another; with the build they came from.
    pub fn answers(
        &self,
        key: &PairKey,
        of: AnswersOf,
        before: i64,
    ) -> Result<Option<(String, Vec<Answer>)>, StoreError> {
        let conn = self.lock();
        let (build, same) = match of {
            AnswersOf::Build(b) => (b, true),
            AnswersOf::OtherThan(b) => (b, false),
        };
        let run: Option<(i64, String)> = conn
            .query_row(
                "SELECT r.id, r.build FROM runs r
                 WHERE r.target = ?1 AND r.model = ?2 AND r.scenario = ?3 AND r.id < ?4
                   AND (r.build = ?5) = ?6
                   AND EXISTS (SELECT 1 FROM answers a WHERE a.run_id = r.id)
                 ORDER BY r.id DESC LIMIT 1",
                params![key.target, key.model, key.scenario, before, build, same],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((run_id, build)) = run else {
            return Ok(None);
        };
        let mut select = conn.prepare(
            "SELECT prompt, tokens, logprobs FROM answers WHERE run_id = ?1 ORDER BY prompt",
        )?;
        let rows = select.query_map([run_id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        let mut answers = Vec::new();
        for row in rows {
            let (prompt, tokens, logprobs) = row?;
            let logprobs: Vec<Option<f64>> = serde_json::from_str(&logprobs)?;
            answers.push(Answer {
                prompt: prompt as usize,
                tokens: serde_json::from_str(&tokens)?,
                logprobs: logprobs
                    .into_iter()
                    .map(|l| l.unwrap_or(f64::NAN))
                    .collect(),
            });
        }
        Ok(Some((build, answers)))
    }
}
