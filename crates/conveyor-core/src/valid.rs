//! The type of a checked request. A leaf, so that the store traits beside their nouns
//! (breakers, access) can take one; its constructors, which run the checks, are in
//! [`crate::validate`].

/// A request that passed its checks. Only `validate.rs` makes one (a constructor per kind of
/// request), and the stores take these: every rule here runs once, above the stores,
/// however many layers a request passes through, and no store can check it differently.
#[derive(Debug, Clone, PartialEq)]
pub struct Valid<T>(pub(crate) T);

impl<T> Valid<T> {
    pub fn get(&self) -> &T {
        &self.0
    }

    pub fn into_inner(self) -> T {
        self.0
    }

    /// The same request changed by a decorator that transforms what is stored (encryption at
    /// rest), or an error. The caller vouches that `change` keeps it valid: it derives the new
    /// fields from the checked ones, so they are not checked again.
    pub fn try_vouched_map<E>(self, change: impl FnOnce(T) -> Result<T, E>) -> Result<Valid<T>, E> {
        change(self.0).map(Valid)
    }
}

impl<T> std::ops::Deref for Valid<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
