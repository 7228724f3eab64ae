// The workspace beyond sandboxes, against a real server: API keys (create, use, revoke),
// storage, workspaces and their members. Wallet, ledger and usage are in tasks.test.js, where
// the runs are billed.

import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import {
  ApiKey,
  Image,
  Sandbox,
  User,
  Workspace,
  AuthenticationError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  PermissionDeniedError,
} from '@cella/sdk';
import { startServer } from './server.js';

let srv;

before(async () => {
  srv = await startServer();
});

after(async () => {
  await srv?.stop();
});

describe('ApiKey', () => {
  it('makes a key with scopes, which works until it is revoked', async () => {
    const made = await ApiKey.create({ ...srv.opts, name: 'ci reader', scopes: ['sandboxes:read'] });
    assert.equal(made.name, 'ci reader');
    assert.deepEqual(made.scopes, ['sandboxes:read']);
    assert.equal(typeof made.key, 'string');
    assert.ok(made.key.startsWith(made.prefix));
    assert.ok(made.createdAt instanceof Date);
    const listed = await ApiKey.list(srv.opts);
    const mine = listed.find((k) => k.id === made.id);
    assert.ok(mine, 'listed');
    assert.equal(mine.key, null, 'a listing never shows the secret');
    const reader = { ...srv.opts, apiKey: made.key };
    assert.deepEqual(await Sandbox.list(reader), []);
    await assert.rejects(Sandbox.create({ ...reader, size: 'xs' }), PermissionDeniedError);
    await assert.rejects(ApiKey.create({ ...reader, name: 'escalate', scopes: ['admin'] }), PermissionDeniedError);
    await ApiKey.revoke(made.id, srv.opts);
    await assert.rejects(Sandbox.list(reader), AuthenticationError);
    assert.ok(!(await ApiKey.list(srv.opts)).some((k) => k.id === made.id));
    await assert.rejects(ApiKey.revoke('keynothere', srv.opts), NotFoundError);
    await assert.rejects(ApiKey.create({ ...srv.opts, name: 'x', scopes: ['no:such'] }), (e) => e.status === 400);
  });
});

describe('Workspace', () => {
  it('reports storage by kind', async () => {
    const st = await Workspace.storage(srv.opts);
    for (const k of ['usedBytes', 'snapshotsBytes', 'artifactsBytes', 'templatesBytes', 'imagesBytes']) {
      assert.equal(typeof st[k], 'number', k);
    }
  });

  it('makes an organization workspace and manages its members', async () => {
    const org = await Workspace.create({ ...srv.opts, name: 'acme', kind: 'organization', plan: 'business' });
    assert.equal(org.kind, 'organization');
    assert.equal(org.plan, 'business');
    assert.ok((await Workspace.list(srv.opts)).some((w) => w.id === org.id));
    const user = await User.create({ ...srv.opts, email: 'ada@example.org', name: 'Ada', password: 'correct horse battery' });
    assert.equal(user.email, 'ada@example.org');
    assert.ok(user.createdAt instanceof Date);
    await assert.rejects(User.create({ ...srv.opts, email: 'ADA@example.org', name: 'Again', password: 'correct horse battery' }), ConflictError);
    await assert.rejects(User.create({ ...srv.opts, email: 'bob@example.org', name: 'Bob', password: 'short' }), InvalidRequestError);
    const at = { ...srv.opts, workspaceId: org.id };
    const added = await Workspace.addMember('ada@example.org', 'member', at);
    assert.equal(added.userId, user.id);
    assert.equal(added.role, 'member');
    await assert.rejects(Workspace.addMember('ada@example.org', 'member', at), ConflictError);
    assert.equal((await Workspace.updateMember(user.id, 'admin', at)).role, 'admin');
    assert.ok((await Workspace.members(at)).some((m) => m.userId === user.id && m.role === 'admin'));
    await Workspace.removeMember(user.id, at);
    assert.ok(!(await Workspace.members(at)).some((m) => m.userId === user.id));
    await assert.rejects(Workspace.addMember('nobody@example.org', 'member', at), NotFoundError);
  });
});

describe('Image', () => {
  it('lists imported images; an archive that is no image is refused; deleting an unknown one is NotFoundError', async () => {
    assert.deepEqual(await Image.list(srv.opts), []);
    await assert.rejects(Image.importTar(new TextEncoder().encode('not a tar archive'), { ...srv.opts, name: 'junk' }), (e) => e.status >= 400 && e.status < 500);
    assert.deepEqual(await Image.list(srv.opts), [], 'nothing was kept');
    await assert.rejects(Image.delete('img000000000000000000', srv.opts), NotFoundError);
  });
});
