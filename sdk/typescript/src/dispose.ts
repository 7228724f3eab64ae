// `Symbol.asyncDispose` (explicit resource management) where the runtime lacks it (Node before
// 20.4): the symbol the proposal's polyfills register, so that `await using` works with them.
const symbols = Symbol as { asyncDispose?: symbol };
symbols.asyncDispose ??= Symbol.for('Symbol.asyncDispose');

export {};
