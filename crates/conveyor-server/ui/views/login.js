// The sign-in page: the token is sent once to `POST /v1/session`, which answers with an
// HttpOnly cookie; the token itself is never stored by the page.

import { h, mount } from '../dom.js';
import * as api from '../api.js';

export function loginView({ message, onLogin }) {
  const error = h('div', { class: 'login-error', id: 'login-error', role: 'alert' });
  const input = h('input', {
    id: 'token', name: 'token', type: 'password', required: true, autocomplete: 'current-password',
    spellcheck: 'false', placeholder: 'Paste your access token',
  });
  const submit = h('button', { class: 'btn btn-primary btn-block', type: 'submit', id: 'login-submit', text: 'Sign in' });
  const form = h('form', {
    class: 'login-form',
    onsubmit: async (event) => {
      event.preventDefault();
      const token = input.value.trim();
      if (!token) return;
      submit.disabled = true;
      submit.textContent = 'Signing in…';
      error.replaceChildren();
      try {
        const session = await api.login(token);
        if (!session) {
          // The token was accepted but the cookie did not come back: the server marks it
          // Secure, which browsers keep only over HTTPS (and on localhost).
          mount(error, h('p', { class: 'alert alert-error', text: 'The token was accepted, but the browser did not keep the session cookie. Open the dashboard over HTTPS (or on localhost) and sign in again.' }));
          submit.disabled = false;
          submit.textContent = 'Sign in';
          return;
        }
        input.value = '';
        onLogin(session);
      } catch (failure) {
        const text = failure.status === 401 || failure.status === 403
          ? 'That token was not accepted. Check it and try again.'
          : `Sign-in failed: ${failure.message}`;
        mount(error, h('p', { class: 'alert alert-error', text }));
        submit.disabled = false;
        submit.textContent = 'Sign in';
        input.focus();
        input.select();
      }
    },
  },
  h('label', { for: 'token', text: 'Access token' }),
  input,
  h('p', { class: 'hint' }, 'Create one with ', h('code', { text: 'conveyor token create --role admin' }), '.'),
  error,
  submit);

  const page = h('div', { class: 'login' },
    h('div', { class: 'login-card' },
      h('div', { class: 'login-brand' },
        h('img', { src: '/ui/favicon.svg', alt: '', width: 36, height: 36 }),
        h('div', {}, h('h1', { text: 'Conveyor' }), h('p', { class: 'muted', text: 'Sign in to the dashboard' }))),
      message ? h('p', { class: 'alert alert-info', text: message }) : null,
      form));
  queueMicrotask(() => input.focus());
  return page;
}
