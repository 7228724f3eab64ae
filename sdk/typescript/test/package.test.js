// The package itself: its manifest, both builds (ES modules and CommonJS) and their type
// declarations, which tsc writes from the sources.

import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import * as sdk from '@cella/sdk';

const root = new URL('../', import.meta.url);
const pkg = JSON.parse(readFileSync(new URL('package.json', root), 'utf8'));
const require = createRequire(import.meta.url);

describe('package', () => {
  it('has ESM and CommonJS entry points with types, and no runtime dependencies', () => {
    assert.equal(pkg.name, '@cella/sdk');
    assert.equal(pkg.type, 'module');
    const dot = pkg.exports['.'];
    assert.equal(dot.import.default, './dist/esm/index.js');
    assert.equal(dot.import.types, './dist/esm/index.d.ts');
    assert.equal(dot.require.default, './dist/cjs/index.js');
    assert.equal(dot.require.types, './dist/cjs/index.d.ts');
    assert.equal(pkg.types, './dist/esm/index.d.ts');
    for (const f of [dot.import.default, dot.import.types, dot.require.default, dot.require.types]) {
      assert.ok(existsSync(new URL(f, root)), `${f} was not built`);
    }
    assert.equal(pkg.dependencies, undefined);
    assert.match(pkg.devDependencies.typescript, /^\d+\.\d+\.\d+$/, 'typescript is pinned exactly');
  });

  it('require() gives the same API as import', () => {
    const cjs = require('@cella/sdk');
    assert.deepEqual(Object.keys(cjs).sort(), Object.keys(sdk).sort());
    assert.equal(typeof cjs.Sandbox.create, 'function');
    assert.ok(new cjs.NotFoundError('x') instanceof cjs.CellaError);
  });

  it('declares a type for every runtime export, in both builds', () => {
    for (const build of ['esm', 'cjs']) {
      const dts = readFileSync(new URL(`dist/${build}/index.d.ts`, root), 'utf8');
      for (const name of Object.keys(sdk)) assert.match(dts, new RegExp(`\\b${name}\\b`), `${build}: ${name} is not declared`);
    }
  });

  it('declares every method of the public classes', () => {
    const files = { Sandbox: 'sandbox', SandboxPaginator: 'sandbox', Commands: 'commands', CommandHandle: 'commands', Files: 'files', WatchHandle: 'files',
      CodeInterpreter: 'code', Pty: 'pty', PtyHandle: 'pty', Snapshot: 'resources', Artifact: 'resources', Template: 'resources', TemplateBuild: 'resources',
      Task: 'tasks', TaskRun: 'tasks', Workspace: 'workspace', ApiKey: 'keys', Image: 'images', User: 'images' };
    for (const [cls, file] of Object.entries(files)) {
      const dts = readFileSync(new URL(`dist/esm/${file}.d.ts`, root), 'utf8');
      const body = dts.slice(dts.indexOf(`export declare class ${cls} `));
      const decl = body.slice(0, body.indexOf('\n}\n'));
      assert.ok(decl.length > 0, `${cls} is not declared`);
      const methods = Object.getOwnPropertyNames(sdk[cls].prototype).filter((m) => m !== 'constructor' && !m.startsWith('_'));
      for (const m of methods) assert.match(decl, new RegExp(`\\b${m}\\b`), `${cls}.${m} is not declared`);
      const statics = Object.getOwnPropertyNames(sdk[cls]).filter((m) => !['length', 'name', 'prototype'].includes(m));
      for (const m of statics) assert.match(decl, new RegExp(`static ${m}\\(`), `static ${cls}.${m} is not declared`);
    }
  });

  it('the error classes form the documented hierarchy', () => {
    for (const name of Object.keys(sdk).filter((n) => n.endsWith('Error'))) {
      assert.ok(new sdk[name]('x') instanceof sdk.CellaError, name);
      assert.equal(new sdk[name]('x').name, name);
    }
    assert.ok(new sdk.UnknownLanguageError('x') instanceof sdk.InvalidRequestError);
    assert.ok(new sdk.ConcurrencyLimitError('x') instanceof sdk.RateLimitedError);
  });
});
