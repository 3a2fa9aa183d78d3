-- Read-only: the state hash and the entry digests, as flat field/value lists.
return {redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[3])}
