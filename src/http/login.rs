//! Exporter logins: a `basic_auth_users` password checked through the
//! bounded bcrypt checks ([`PasswordChecks`]), verified credentials
//! remembered, unknown users costing the same check as known ones.

use super::password_checks::{Checked, PasswordChecks};
use crate::config::web::{VERIFIED_CACHE, WebSecurity, basic_credentials};

/// How a login came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Login {
    Allowed,
    Refused,
    /// The password could not be checked now: too many were being
    /// checked, or the daemon is stopping.
    Unchecked,
}

impl WebSecurity {
    /// Whether `authorization` (the whole header value) names a user with
    /// the right password; bcrypt runs through `checks`, which bounds it.
    pub async fn login(&self, authorization: &str, checks: &PasswordChecks) -> Login {
        if self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(authorization)
        {
            return Login::Allowed;
        }
        let Some((user, password)) = basic_credentials(authorization) else {
            return Login::Refused;
        };
        // An unknown name costs the same check as a known one, so how long
        // a refusal takes does not tell which names exist.
        let (hash, known) = match self.users.get(&user) {
            Some(hash) => (hash.clone(), true),
            None => (self.decoy.clone(), false),
        };
        match checks.verify(password, hash).await {
            Checked::Right if known => {
                let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
                if verified.len() >= VERIFIED_CACHE {
                    verified.clear();
                }
                verified.insert(authorization.to_owned());
                Login::Allowed
            }
            Checked::Unchecked => Login::Unchecked,
            Checked::Right | Checked::Wrong => Login::Refused,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::web::tests::load;

    #[tokio::test]
    async fn unknown_users_cost_a_check_of_the_users_cost() {
        use base64::Engine;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let hash = bcrypt::hash("", 5).unwrap();
        let web = load(
            "decoy",
            &format!(
                "basic_auth_users:\n  alice: '{hash}'\n  bob: '{}'\n",
                bcrypt::hash("x", 4).unwrap()
            ),
        )
        .unwrap();
        assert_eq!(
            web.decoy.parse::<bcrypt::HashParts>().unwrap().get_cost(),
            5
        );
        assert_eq!(bcrypt::verify("", &web.decoy).ok(), Some(false));
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let checks = PasswordChecks::new(Default::default(), move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let basic = |credentials: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(credentials)
            )
        };
        assert_eq!(web.login(&basic("nobody:"), &checks).await, Login::Refused);
        assert_eq!(
            web.login(&basic("alice:guess"), &checks).await,
            Login::Refused
        );
        assert_eq!(web.login(&basic("alice:"), &checks).await, Login::Allowed);
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(web.login(&basic("alice:"), &checks).await, Login::Allowed);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "a verified password is remembered"
        );
    }
}
