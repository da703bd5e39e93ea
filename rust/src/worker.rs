pub struct Worker;
