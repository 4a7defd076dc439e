-- Every row of the read model is updated many times (each delta, each newer
-- snapshot). With pages filled to the brim, an update could almost never
-- stay on its row's page, so each one wrote a new primary key entry and left
-- its page to vacuum: measured in the benchmark, 5% of updates were HOT.
-- Leaving 30% of each page free lets a batch update a good share of a
-- page's rows in place (HOT: no index entry; old versions are pruned on the
-- page), which also keeps the primary key from growing with updates. It
-- applies to pages written from now on.
ALTER TABLE {{schema}}.{{jobs}} SET (fillfactor = 70);
